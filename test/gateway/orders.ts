import { toHttpResponse, type GatewayRequest, type HttpResponse, type IdempotencyContext } from "../../src/gateway/index.js";

/**
 * The co-located tests' service: an `orders` table in the registry's
 * database, a POST carrying an amount, and a handler that writes one order
 * row in the transaction that completes the operation.
 */
export const CREATE_ORDERS = "CREATE TABLE orders (id serial PRIMARY KEY, operation_id uuid UNIQUE NOT NULL, amount int NOT NULL)";

export const orderRequest = (key: string, amount = 10): GatewayRequest => ({
  method: "POST",
  path: "/v1/orders",
  query: "",
  headers: { "idempotency-key": key, "content-type": "application/json" },
  body: new TextEncoder().encode(JSON.stringify({ amount })),
});

/** One order row, completed in its transaction. */
export const createOrder = async (ctx: IdempotencyContext): Promise<HttpResponse> =>
  toHttpResponse(
    await ctx.transaction(async (tx) => {
      const { rows } = await tx.query<{ id: number }>("INSERT INTO orders (operation_id, amount) VALUES ($1, $2) RETURNING id", [
        ctx.operationId,
        ctx.json<{ amount: number }>().amount,
      ]);
      return { status: 201, json: { id: rows[0]!.id } };
    }),
  );
