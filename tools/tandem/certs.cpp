// `tandem certs DIR --nodes a,b,c [--hosts NAME=HOST]...`: a cluster's
// certificates with OpenSSL's library (issue 18's TLS; the control
// endpoint's HTTPS uses them too).  In DIR:
//
//   ca.pem, ca.key          the cluster's CA (EC P-256, 10 years); the key
//                           signs nothing else and stays with whoever issues
//   cluster.secret          32 random bytes (hex): the key of the join tokens
//   NAME/cert.pem, key.pem  the node's certificate (serverAuth and
//                           clientAuth: a node accepts and connects) and key;
//                           SANs DNS:NAME, DNS:localhost, IP:127.0.0.1,
//                           IP:::1 and its --hosts (an IP literal as an IP SAN)
//   NAME/ca.pem             the CA certificate, to verify the others
//   NAME/join.token         HMAC-SHA256(cluster secret, NAME), hex: binds
//                           the name to the node (CAF's OpenSSL layer checks
//                           the chain, not names)
//
// Keys and secrets are written 0600.  DIR must be new or empty: issuing
// into an existing cluster's folder would replace its CA.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/ip/address.hpp>

#include "commands.hpp"
#include "launch/run_config.hpp"

#ifdef TANDEM_HAVE_TLS
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#endif

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

struct certs_options {
  std::string dir;
  std::vector<std::string> nodes;
  std::vector<std::string> hosts;  ///< NAME=HOST, repeatable
  int days = 825;                  ///< node certificates' validity
};

/// Writes `text` to `path` with `mode` (created new; fsynced).
void write_file(const fs::path& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0 || ::fchmod(fd, mode) != 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())
      || ::fsync(fd) != 0 || ::close(fd) != 0)
    throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(errno));
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

#ifdef TANDEM_HAVE_TLS

/// OpenSSL's last error, as text.
std::string ssl_error(const char* what) {
  char buf[256] = {0};
  ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
  return std::string(what) + ": " + buf;
}

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;

pkey_ptr new_key() {
  pkey_ptr key(EVP_EC_gen("P-256"));
  if (!key)
    throw std::runtime_error(ssl_error("EC P-256 key"));
  return key;
}

void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext || X509_add_ext(cert, ext, -1) != 1) {
    X509_EXTENSION_free(ext);
    throw std::runtime_error(ssl_error(("certificate extension " + value).c_str()));
  }
  X509_EXTENSION_free(ext);
}

/// A certificate for `key` named `cn`, valid `days`, signed by `issuer`
/// (nullptr: self-signed, the CA) with `issuer_key`; `exts` (nid, value)
/// in order.
x509_ptr make_cert(EVP_PKEY* key, const std::string& cn, int days, X509* issuer, EVP_PKEY* issuer_key,
                   const std::vector<std::pair<int, std::string>>& exts) {
  x509_ptr cert(X509_new());
  unsigned char serial[16];
  if (!cert || RAND_bytes(serial, sizeof serial) != 1)
    throw std::runtime_error(ssl_error("certificate"));
  serial[0] &= 0x7f;  // positive
  std::unique_ptr<BIGNUM, deleter<BIGNUM, BN_free>> bn(BN_bin2bn(serial, sizeof serial, nullptr));
  X509_set_version(cert.get(), 2);
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get()));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);  // an hour of clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("Tandem cluster"), -1,
                             -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                             0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  for (const auto& [nid, value] : exts)
    add_ext(cert.get(), signer, nid, value);
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0)
    throw std::runtime_error(ssl_error(("signing " + cn).c_str()));
  return cert;
}

std::string pem_of(X509* cert) {
  std::unique_ptr<BIO, deleter<BIO, BIO_free_all>> bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string pem_of(EVP_PKEY* key) {
  std::unique_ptr<BIO, deleter<BIO, BIO_free_all>> bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

int issue(const certs_options& o) {
  // Check everything before writing anything.
  std::set<std::string> names;
  for (const auto& n : o.nodes) {
    if (!valid_node_name(n)) {  // the rule of tandem node --name and the placement's NODE:
      std::fprintf(stderr, "tandem certs: --nodes: '%s' is not a node name (lowercase letters, digits and '-'; "
                           "not cpu, cuda or auto)\n", n.c_str());
      return 2;
    }
    if (!names.insert(n).second) {
      std::fprintf(stderr, "tandem certs: --nodes: '%s' is named twice\n", n.c_str());
      return 2;
    }
  }
  if (names.empty()) {
    std::fprintf(stderr, "tandem certs: --nodes names no node\n");
    return 2;
  }
  std::map<std::string, std::vector<std::string>> sans;
  for (const auto& n : names)
    sans[n] = {"DNS:" + n, "DNS:localhost", "IP:127.0.0.1", "IP:::1"};
  for (const auto& h : o.hosts) {
    const auto eq = h.find('=');
    const auto node = h.substr(0, eq);
    const auto host = eq == std::string::npos ? "" : h.substr(eq + 1);
    if (eq == std::string::npos || !names.count(node) || host.empty()
        || host.find_first_of(",= \t") != std::string::npos) {
      std::fprintf(stderr, "tandem certs: --hosts '%s': not NAME=HOST with NAME one of --nodes\n", h.c_str());
      return 2;
    }
    boost::system::error_code ec;
    boost::asio::ip::make_address(host, ec);
    sans[node].push_back((ec ? "DNS:" : "IP:") + host);
  }
  if (o.days < 1 || o.days > 3650) {
    std::fprintf(stderr, "tandem certs: --days %d: between 1 and 3650\n", o.days);
    return 2;
  }
  const fs::path dir(o.dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    std::fprintf(stderr, "tandem certs: %s exists and is not an empty folder: a cluster's folder is made once "
                         "(its CA signs every node; issue into a new folder)\n", dir.c_str());
    return 2;
  }
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);

  auto ca_key = new_key();
  auto ca = make_cert(ca_key.get(), "Tandem cluster CA", 3650, nullptr, ca_key.get(),
                      {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                       {NID_key_usage, "critical,keyCertSign,cRLSign"},
                       {NID_subject_key_identifier, "hash"}});
  const auto ca_pem = pem_of(ca.get());
  write_file(dir / "ca.pem", ca_pem, 0644);
  write_file(dir / "ca.key", pem_of(ca_key.get()), 0600);
  unsigned char secret[32];
  if (RAND_bytes(secret, sizeof secret) != 1)
    throw std::runtime_error(ssl_error("cluster secret"));
  write_file(dir / "cluster.secret", hex(secret, sizeof secret) + "\n", 0600);

  std::printf("tandem certs: %s: a CA (ca.pem; ca.key) and the cluster secret (cluster.secret)\n", dir.c_str());
  for (const auto& n : o.nodes) {
    auto key = new_key();
    std::string san;
    for (const auto& s : sans[n])
      san += (san.empty() ? "" : ",") + s;
    auto cert = make_cert(key.get(), n, o.days, ca.get(), ca_key.get(),
                          {{NID_basic_constraints, "critical,CA:FALSE"},
                           {NID_key_usage, "critical,digitalSignature"},
                           {NID_ext_key_usage, "serverAuth,clientAuth"},
                           {NID_subject_alt_name, san},
                           {NID_subject_key_identifier, "hash"},
                           {NID_authority_key_identifier, "keyid:always"}});
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (!HMAC(EVP_sha256(), secret, sizeof secret, reinterpret_cast<const unsigned char*>(n.data()), n.size(), mac,
              &mac_len))
      throw std::runtime_error(ssl_error("join token"));
    const auto node_dir = dir / n;
    fs::create_directories(node_dir);
    ::chmod(node_dir.c_str(), 0700);
    write_file(node_dir / "cert.pem", pem_of(cert.get()), 0644);
    write_file(node_dir / "key.pem", pem_of(key.get()), 0600);
    write_file(node_dir / "ca.pem", ca_pem, 0644);
    write_file(node_dir / "join.token", hex(mac, mac_len) + "\n", 0600);
    std::printf("  node %s: %s/ (cert.pem, key.pem, ca.pem, join.token; names %s): copy it to that node only\n",
                n.c_str(), node_dir.c_str(), san.c_str());
  }
  std::printf("Keep ca.key and cluster.secret where the cluster is administered: the leader checks join tokens "
              "with the secret; no node needs the CA's key.\n"
              "The control endpoint can serve HTTPS with a node's files: control.tls_cert = NAME/cert.pem, "
              "control.tls_key = NAME/key.pem; `tandem shell --ca %s` verifies it.\n",
              (dir / "ca.pem").c_str());
  return 0;
}

#endif

} // namespace

void add_certs(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<certs_options>();
  auto* cmd = app.add_subcommand("certs", "Create a cluster's CA, secret and one TLS certificate and join token "
                                          "per node (serverAuth and clientAuth; host names as SANs), with OpenSSL");
  cmd->add_option("dir", o->dir, "A new (or empty) folder for the files")->required();
  cmd->add_option("--nodes", o->nodes, "The nodes' names, comma-separated (a certificate each)")
    ->required()
    ->delimiter(',');
  cmd->add_option("--hosts", o->hosts, "NAME=HOST: another name of node NAME for its certificate (a DNS name, or an "
                                       "IP address; repeatable, or comma-separated)")
    ->delimiter(',');
  cmd->add_option("--days", o->days, "Validity of the node certificates in days (the CA's: 10 years)")
    ->capture_default_str();
  cmd->callback([o, &exit_code] {
#ifdef TANDEM_HAVE_TLS
    try {
      exit_code = issue(*o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem certs: %s\n", e.what());
      exit_code = 1;
    }
#else
    (void)o;
    std::fprintf(stderr, "tandem certs: this build has no OpenSSL (libssl-dev was missing when it was configured)\n");
    exit_code = 1;
#endif
  });
}

} // namespace tandem::cli
