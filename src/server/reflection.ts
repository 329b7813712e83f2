import { toBinary, type DescFile, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import type { ConnectRouter } from "@connectrpc/connect";
import * as v1 from "../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../gen/grpc/reflection/v1alpha/reflection_pb.js";

/**
 * gRPC server reflection (grpc.reflection.v1, and v1alpha for older tools):
 * buf curl without --schema, grpcurl, grpcui and Postman learn the served
 * services and their files' descriptors from the running server. Like the
 * health service it needs no credentials: it tells what proto/ tells (the
 * published contract), and nothing of any record; IDEM_REFLECTION=false
 * serves neither version.
 */
export function reflectionRoutes(served: readonly DescService[]): (router: ConnectRouter) => void {
  const index = new SchemaIndex([...served, v1.ServerReflection, v1alpha.ServerReflection]);
  return (router) => {
    router.service(v1.ServerReflection, { serverReflectionInfo: (requests) => answer(index, requests) });
    router.service(v1alpha.ServerReflection, { serverReflectionInfo: (requests) => answer(index, requests) });
  };
}

/** A question of either version (the same fields under two packages). */
type Request = v1.ServerReflectionRequest | v1alpha.ServerReflectionRequest;

/** An answer of either version, as the fields to create it from. */
interface Answer {
  validHost: string;
  originalRequest: { host: string; messageRequest: Question };
  messageResponse:
    | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
    | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
    | { case: "listServicesResponse"; value: { service: Array<{ name: string }> } }
    | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };
}

type Question =
  | { case: "fileByFilename" | "fileContainingSymbol" | "allExtensionNumbersOfType" | "listServices"; value: string }
  | { case: "fileContainingExtension"; value: { containingType: string; extensionNumber: number } }
  | { case: undefined; value?: undefined };

const NOT_FOUND = 5;
const UNIMPLEMENTED = 12;

/** One answer per question, in order; the files already sent on this stream are not sent again. */
async function* answer(index: SchemaIndex, requests: AsyncIterable<Request>): AsyncIterable<Answer> {
  const sent = new Set<string>();
  for await (const request of requests) {
    const asked: Question =
      request.messageRequest.case === "fileContainingExtension"
        ? { case: "fileContainingExtension", value: { containingType: request.messageRequest.value.containingType, extensionNumber: request.messageRequest.value.extensionNumber } }
        : request.messageRequest;
    const reply = (messageResponse: Answer["messageResponse"]): Answer => ({
      validHost: request.host,
      originalRequest: { host: request.host, messageRequest: asked },
      messageResponse,
    });
    const error = (code: number, message: string) => reply({ case: "errorResponse", value: { errorCode: code, errorMessage: message } });
    const files = (file: DescFile | undefined, what: string) => {
      if (!file) return error(NOT_FOUND, `${what} not found`);
      const descriptors = index.withDependencies(file, sent).map((f) => toBinary(FileDescriptorProtoSchema, f.proto));
      return reply({ case: "fileDescriptorResponse", value: { fileDescriptorProto: descriptors } });
    };
    switch (asked.case) {
      case "listServices":
        yield reply({ case: "listServicesResponse", value: { service: index.services.map((name) => ({ name })) } });
        break;
      case "fileByFilename":
        yield files(index.fileNamed(asked.value), `file ${asked.value}`);
        break;
      case "fileContainingSymbol":
        yield files(index.fileDeclaring(asked.value), `symbol ${asked.value}`);
        break;
      case "fileContainingExtension":
        // The served files declare no extensions.
        yield error(NOT_FOUND, `extension ${asked.value.extensionNumber} of ${asked.value.containingType} not found`);
        break;
      case "allExtensionNumbersOfType":
        yield index.fileDeclaring(asked.value)
          ? reply({ case: "allExtensionNumbersResponse", value: { baseTypeName: asked.value, extensionNumber: [] } })
          : error(NOT_FOUND, `type ${asked.value} not found`);
        break;
      default:
        yield error(UNIMPLEMENTED, "this question is not known to this server");
    }
  }
}

/** The served services' files and their imports, by file name and by every symbol they declare. */
class SchemaIndex {
  readonly services: string[];
  private readonly files = new Map<string, DescFile>();
  private readonly symbols = new Map<string, DescFile>();

  constructor(services: readonly DescService[]) {
    this.services = services.map((s) => s.typeName).sort();
    for (const service of services) this.add(service.file);
  }

  fileNamed(name: string): DescFile | undefined {
    return this.files.get(name);
  }

  fileDeclaring(symbol: string): DescFile | undefined {
    return this.symbols.get(symbol);
  }

  /** `file`, then the files it imports (transitively) that are not in `sent`; all are added to `sent`. */
  withDependencies(file: DescFile, sent: Set<string>): DescFile[] {
    const out: DescFile[] = [];
    const visit = (f: DescFile, asked: boolean) => {
      if (sent.has(f.proto.name) && !asked) return;
      sent.add(f.proto.name);
      out.push(f);
      for (const dependency of f.dependencies) visit(dependency, false);
    };
    visit(file, true);
    return out;
  }

  private add(file: DescFile): void {
    if (this.files.has(file.proto.name)) return;
    this.files.set(file.proto.name, file);
    for (const service of file.services) {
      this.symbols.set(service.typeName, file);
      for (const method of service.methods) this.symbols.set(`${service.typeName}.${method.name}`, file);
    }
    const addMessage = (message: DescMessage) => {
      this.symbols.set(message.typeName, file);
      for (const nested of message.nestedMessages) addMessage(nested);
      for (const nested of message.nestedEnums) this.symbols.set(nested.typeName, file);
    };
    for (const message of file.messages) addMessage(message);
    for (const enumeration of file.enums) this.symbols.set(enumeration.typeName, file);
    for (const dependency of file.dependencies) this.add(dependency);
  }
}
