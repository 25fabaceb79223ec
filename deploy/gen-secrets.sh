#!/usr/bin/env bash
# The secrets deploy/compose.secure.yml mounts, made with openssl only:
#   ca.pem               the CA every client checks the broker and serving against (ca.key signs, never mounted)
#   kafka-broker.pem     the broker's private key (PKCS#8) and certificate, Kafka's PEM keystore
#   kafka-password       the SASL/PLAIN password of Kafka user "streamrec" (kafka.sasl_password_file)
#   kafka-jaas.conf      the broker's JAAS file that holds the same password
#   serving.pem, serving.key   serving's TLS certificate and key
#
# usage: deploy/gen-secrets.sh [OUT_DIR]          (OUT_DIR: deploy/secrets, which git ignores)
#   EXTRA_SANS="DNS:kafka.example.com,IP:10.0.0.5"  more names the broker and serving certificates carry, for
#                                                    clients that reach them by another name (STREAMREC_KAFKA_EXTERNAL_HOST)
#   CERT_DAYS=825                                    validity of the certificates
#
# OUT_DIR is mode 700, so on the host only its owner reads the secrets; the files in it are mode 644 because
# compose bind-mounts each one as it is into containers that run as other users (the broker as appuser,
# streamrec as streamrec). ca.key stays 600 and is never mounted. An existing OUT_DIR/ca.pem is never
# overwritten: delete OUT_DIR to rotate every secret at once.
set -euo pipefail

out="${1:-$(cd "$(dirname "$0")" && pwd)/secrets}"
days="${CERT_DAYS:-825}"
extra="${EXTRA_SANS:-}"

if [[ -e "$out/ca.pem" ]]; then
  echo "gen-secrets: $out/ca.pem exists; delete $out to make new secrets" >&2
  exit 1
fi
command -v openssl > /dev/null || { echo "gen-secrets: openssl is not installed" >&2; exit 1; }

mkdir -p "$out"
chmod 700 "$out"
cd "$out"
umask 077

# the CA
openssl req -x509 -newkey rsa:3072 -nodes -keyout ca.key -out ca.pem -days "$days" -subj "/CN=streamrec compose CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash" 2> /dev/null

# leaf NAME CN SANS: NAME.key (PKCS#8) and NAME.pem signed by the CA, for TLS servers named by SANS
leaf() {
  local name="$1" cn="$2" sans="$3"
  [[ -n "$extra" ]] && sans="$sans,$extra"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "/CN=$cn" 2> /dev/null
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid,issuer" \
    "subjectAltName=$sans" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -sha256 \
    -extfile "$name.ext" -out "$name.pem" 2> /dev/null
  rm -f "$name.csr" "$name.ext"
}

# the broker: clients in the compose network reach it as kafka, clients on the host as localhost
leaf kafka-broker kafka "DNS:kafka,DNS:localhost,IP:127.0.0.1"
cat kafka-broker.key kafka-broker.pem > kafka-broker.keystore.pem
mv kafka-broker.keystore.pem kafka-broker.pem
rm -f kafka-broker.key
# serving: the trainer pushes to serving:50051, the health check asks 127.0.0.1:50051
leaf serving serving "DNS:serving,DNS:localhost,IP:127.0.0.1"

password="$(openssl rand -hex 24)"
printf '%s\n' "$password" > kafka-password
cat > kafka-jaas.conf <<EOF
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
  user_streamrec="$password";
};
EOF

rm -f ca.srl
chmod 644 ca.pem kafka-broker.pem kafka-password kafka-jaas.conf serving.pem serving.key
chmod 600 ca.key
echo "gen-secrets: wrote $out (ca.pem, kafka-broker.pem, kafka-password, kafka-jaas.conf, serving.pem, serving.key)"
