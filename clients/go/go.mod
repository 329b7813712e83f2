// The Go client as a module. Its dependencies are the versions Debian 12 ships in
// /usr/share/gocode (golang-google-grpc-dev and the packages it depends on), built offline in
// vendor mode: debian-vendor.sh links them into vendor/. See clients/README.md.
module github.com/idempotency-coordinator/idempotency-coordinator/clients/go

go 1.19

require (
	google.golang.org/genproto v0.0.0-20200413115906-b5235f65be36
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)

require (
	github.com/golang/protobuf v1.5.2 // indirect
	golang.org/x/net v0.7.0 // indirect
	golang.org/x/sys v0.3.0 // indirect
	golang.org/x/text v0.7.0 // indirect
)
