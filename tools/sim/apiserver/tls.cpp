// Certificate generation with the OpenSSL 3 API (see tls.h).
#include "tls.h"

#include <memory>
#include <stdexcept>

#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace gns::sim::api {
namespace {

struct OpenSslFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, OpenSslFree>;
using CertPtr = std::unique_ptr<X509, OpenSslFree>;
using BioPtr = std::unique_ptr<BIO, OpenSslFree>;

[[noreturn]] void Throw(const std::string& what) {
  char buf[256] = "unknown error";
  if (unsigned long code = ERR_get_error(); code != 0) ERR_error_string_n(code, buf, sizeof(buf));
  ERR_clear_error();
  throw std::runtime_error("tls: " + what + ": " + buf);
}

void Check(int ok, const char* what) {
  if (ok != 1) Throw(what);
}

KeyPtr NewKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) Throw("EVP_EC_gen(P-256)");
  return key;
}

void AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) Throw("extension " + value);
  int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  Check(ok, "X509_add_ext");
}

enum class Role { kCa, kServer, kClient };

// issuer == nullptr: self-signed (the CA).
CertPtr MakeCert(EVP_PKEY* key, Role role, const std::string& common_name, const std::string& org,
                 X509* issuer, EVP_PKEY* issuer_key, const std::string& san) {
  CertPtr cert(X509_new());
  if (!cert) Throw("X509_new");
  Check(X509_set_version(cert.get(), 2), "X509_set_version");
  unsigned char serial_bytes[8];
  Check(RAND_bytes(serial_bytes, sizeof(serial_bytes)), "RAND_bytes");
  std::uint64_t serial = 0;
  for (unsigned char b : serial_bytes) serial = (serial << 8) | b;
  serial &= 0x7fffffffffffffffULL;  // positive, as RFC 5280 asks
  Check(ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial | 1), "serial");
  // An hour of slack for clock skew between the simulator and its clients.
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600)) Throw("notBefore");
  if (!X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600)) Throw("notAfter");
  Check(X509_set_pubkey(cert.get(), key), "X509_set_pubkey");
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (!org.empty()) {
    Check(X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                     reinterpret_cast<const unsigned char*>(org.c_str()), -1, -1, 0),
          "subject O");
  }
  Check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0),
        "subject CN");
  Check(X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name), "issuer");
  X509* ext_issuer = issuer ? issuer : cert.get();
  switch (role) {
    case Role::kCa:
      AddExtension(cert.get(), ext_issuer, NID_basic_constraints, "critical,CA:TRUE");
      AddExtension(cert.get(), ext_issuer, NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature");
      AddExtension(cert.get(), ext_issuer, NID_subject_key_identifier, "hash");
      break;
    case Role::kServer:
      AddExtension(cert.get(), ext_issuer, NID_basic_constraints, "critical,CA:FALSE");
      AddExtension(cert.get(), ext_issuer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
      AddExtension(cert.get(), ext_issuer, NID_ext_key_usage, "serverAuth");
      AddExtension(cert.get(), ext_issuer, NID_subject_alt_name, san);
      AddExtension(cert.get(), ext_issuer, NID_authority_key_identifier, "keyid");
      break;
    case Role::kClient:
      AddExtension(cert.get(), ext_issuer, NID_basic_constraints, "critical,CA:FALSE");
      AddExtension(cert.get(), ext_issuer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
      AddExtension(cert.get(), ext_issuer, NID_ext_key_usage, "clientAuth");
      AddExtension(cert.get(), ext_issuer, NID_authority_key_identifier, "keyid");
      break;
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) <= 0) Throw("X509_sign");
  return cert;
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<std::size_t>(size));
}

std::string CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) Throw("BIO_new");
  Check(PEM_write_bio_X509(bio.get(), cert), "PEM_write_bio_X509");
  return BioText(bio.get());
}

std::string KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio) Throw("BIO_new");
  Check(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr),
        "PEM_write_bio_PrivateKey");
  return BioText(bio.get());
}

}  // namespace

TlsMaterial GenerateTlsMaterial(const std::vector<std::string>& extra_ip_sans) {
  KeyPtr ca_key = NewKey();
  CertPtr ca = MakeCert(ca_key.get(), Role::kCa, "gns-sim-apiserver-ca", "", nullptr, ca_key.get(), "");
  std::string san = "IP:127.0.0.1,IP:::1,DNS:localhost";
  for (const auto& ip : extra_ip_sans) san += ",IP:" + ip;
  KeyPtr server_key = NewKey();
  CertPtr server = MakeCert(server_key.get(), Role::kServer, "gns-sim-apiserver", "", ca.get(),
                            ca_key.get(), san);
  KeyPtr client_key = NewKey();
  CertPtr client = MakeCert(client_key.get(), Role::kClient, "gns-sim-client", "system:masters",
                            ca.get(), ca_key.get(), "");
  TlsMaterial out;
  out.ca_cert_pem = CertPem(ca.get());
  out.server_cert_pem = CertPem(server.get());
  out.server_key_pem = KeyPem(server_key.get());
  out.client_cert_pem = CertPem(client.get());
  out.client_key_pem = KeyPem(client_key.get());
  return out;
}

}  // namespace gns::sim::api
