#pragma once
/// The gate in front of a cluster leader's port (issue 18, "hostile bytes").
///
/// CAF 0.17's network layer crashes on malformed bytes (a few KB of random
/// data to a published port end the process with SIGSEGV), so no byte from
/// the network reaches it before the peer has passed this gate:
///
///   member's CAF ── 127.0.0.1 ──► gate_connector ══ TCP ══► gate ── 127.0.0.1 ──► leader's CAF
///                                (tandem node)                (tandem run)         (door, internal port)
///
/// The gate accepts on cluster.listen.  It first sends a line
/// "tandem-gate/1 NONCE\n" (16 random bytes, hex); the peer answers one line
/// "NAME PROOF\n" within `handshake_ms`, where PROOF is the hex
/// HMAC-SHA256 of NONCE under the node's join token (join_token: "-" when the
/// leader has no cluster secret).  On a good answer the gate says "ok\n"
/// and from then on copies bytes both ways between the peer and the
/// leader's CAF port on loopback; on a bad one (a NAME that is not a node
/// name, a PROOF that is neither "-" nor 64 hex digits, a wrong proof) it
/// says "no REASON\n" and closes.  Without a cluster secret any well-formed
/// answer passes: the gate then keeps out stray bytes, not a local process
/// that speaks its protocol (loopback only; set cluster.secret).  At most `max_pending` connections may be in the handshake at
/// once (more are closed at once), a line is at most 256 bytes, and any
/// malformed line closes the connection: random data, truncated handshakes
/// and idle connections cost the leader nothing but a socket for at most
/// `handshake_ms`.  TLS (cluster.certs) is CAF's, inside the copied bytes.
///
/// The member side is a connector: a loopback listener its own CAF connects
/// to, which dials the gate, answers the nonce, and then copies bytes.

#include <cstdint>
#include <memory>
#include <string>

namespace tandem {

/// The proof of a join token for a nonce: hex HMAC-SHA256(key = token text, nonce text).
std::string gate_proof(const std::string& token_hex, const std::string& nonce_hex);

struct gate_options {
  std::string host;               ///< the public address (cluster.listen)
  uint16_t port = 0;              ///< 0: any free port
  uint16_t inner_port = 0;        ///< the leader's CAF port on 127.0.0.1
  std::string secret_hex;         ///< "" = proofs not checked
  int64_t handshake_ms = 5000;
  size_t max_pending = 64;
};

class cluster_gate {
 public:
  /// Binds and serves on a thread of its own; throws std::runtime_error
  /// naming the address when it cannot bind.
  explicit cluster_gate(gate_options opts);
  ~cluster_gate();
  cluster_gate(const cluster_gate&) = delete;
  cluster_gate& operator=(const cluster_gate&) = delete;
  uint16_t port() const;
  /// Connections refused so far (bad lines, wrong proofs, over the limit).
  uint64_t refused() const;
  void stop();
  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

struct connector_options {
  std::string gate_host;          ///< the leader's gate
  uint16_t gate_port = 0;
  std::string name;               ///< this node's name
  std::string token_hex;          ///< its join token ("" = none)
  int64_t handshake_ms = 10000;
};

class gate_connector {
 public:
  /// Listens on 127.0.0.1 (any free port) for this process's CAF.
  explicit gate_connector(connector_options opts);
  ~gate_connector();
  gate_connector(const gate_connector&) = delete;
  gate_connector& operator=(const gate_connector&) = delete;
  /// The loopback port to give CAF's remote_actor.
  uint16_t port() const;
  /// Why the gate last refused this node ("" = it did not); a refusal
  /// names the reason the gate gave.
  std::string refusal() const;
  /// Why the last connection did not get as far as the gate's answer
  /// (cannot resolve, cannot connect: nothing listens there; "" = it did).
  std::string trouble() const;
  /// Connections the gate let through so far (what follows is CAF's
  /// handshake, over TLS with --certs).
  uint64_t passed() const;
  void stop();
  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

} // namespace tandem
