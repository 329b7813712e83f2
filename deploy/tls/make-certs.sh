#!/usr/bin/env bash
# Makes a throwaway certificate authority and certificates for mutual TLS on
# the coordinator's RPC port, for tests and local trials (never for production:
# the keys are written unencrypted next to the certificates).
#
#   deploy/tls/make-certs.sh DIR [CLIENT_NAME ...]
#
# Writes into DIR: ca.pem/ca.key (the client and server CA), server.pem/key
# (for localhost and 127.0.0.1), one client-NAME.pem/key per CLIENT_NAME
# (default: payments-gateway) with CN=NAME and SAN URI:spiffe://idempotency/NAME,
# and rogue-ca.pem with rogue-client.pem/key signed by another CA (to show that
# a certificate from elsewhere is refused). Needs openssl (Debian's openssl).
set -euo pipefail

if [ "${1:-}" = "" ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  [ "${1:-}" = "" ] && exit 2 || exit 0
fi
command -v openssl >/dev/null || { echo "openssl is missing: apt-get install -y openssl" >&2; exit 1; }

dir=$1; shift
clients=("$@"); [ ${#clients[@]} -eq 0 ] && clients=(payments-gateway)
mkdir -p "$dir"
cd "$dir"
days=30

ca() { # name subject
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -keyout "$1.key" -out "$1.pem" -subj "$2" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() { # name subject san ext-usage ca
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$5.pem" -CAkey "$5.key" -CAcreateserial -days "$days" -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

echo "making a throwaway CA and certificates in $dir"
ca ca "/CN=idempotency test CA"
leaf server "/CN=localhost" "DNS:localhost,IP:127.0.0.1" serverAuth ca
for name in "${clients[@]}"; do
  leaf "client-$name" "/CN=$name" "URI:spiffe://idempotency/$name" clientAuth ca
  echo "  client-$name.pem: CN=$name, URI:spiffe://idempotency/$name"
done
ca rogue-ca "/CN=somebody else's CA"
leaf rogue-client "/CN=payments-gateway" "URI:spiffe://idempotency/payments-gateway" clientAuth rogue-ca
chmod 600 ./*.key
echo "  server.pem (localhost, 127.0.0.1), ca.pem, rogue-client.pem (signed by rogue-ca.pem)"
