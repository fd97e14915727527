#!/bin/sh
# Remakes the certificates of src/cert.rs's and src/tls/mod.rs's tests: a
# CA, one EC P-256 key for localhost, and certificates of it with fixed dates (the
# tests set their clock against these dates). Needs openssl; run from this directory.
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$work/ca.key" -out "$work/ca.crt" -days 36500 -subj /CN=sluice-test-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout localhost.key -out "$work/localhost.csr" -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$work/ext"
printf '[ca]\ndefault_ca=d\n[d]\ndatabase=%s/index\nserial=%s/serial\nnew_certs_dir=%s\ndefault_md=sha256\npolicy=p\nunique_subject=no\n[p]\ncommonName=supplied\n' \
    "$work" "$work" "$work" > "$work/ca.cnf"
: > "$work/index"
echo 01 > "$work/serial"
# UTCTime up to 2049, GeneralizedTime from 2050 (RFC 5280).
for dates in 2030:300101000000Z:300201000000Z 2051:20510101000000Z:20520101000000Z; do
    name=${dates%%:*}
    rest=${dates#*:}
    openssl ca -batch -notext -config "$work/ca.cnf" -cert "$work/ca.crt" -keyfile "$work/ca.key" \
        -in "$work/localhost.csr" -out "$name.crt" -extfile "$work/ext" \
        -startdate "${rest%%:*}" -enddate "${rest#*:}" 2>/dev/null
done
# A second key and a 2030 certificate of it: a renewal with a new key, written one
# file after the other.
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout other.key -out "$work/other.csr" -subj /CN=localhost 2>/dev/null
openssl ca -batch -notext -config "$work/ca.cnf" -cert "$work/ca.crt" -keyfile "$work/ca.key" \
    -in "$work/other.csr" -out other-2030.crt -extfile "$work/ext" \
    -startdate 300101000000Z -enddate 300201000000Z 2>/dev/null
