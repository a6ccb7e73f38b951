#pragma once
/// The control endpoint's HTTP/1.1 server (Boost.Beast; HTTPS with a
/// certificate and key, OpenSSL through Boost.Asio): one I/O thread of
/// its own, which reaches the run only through the control actor
/// (messages/control.hpp).  Every request must carry the run's token
/// (`Authorization: Bearer TOKEN`, compared in constant time); one without
/// it is answered 401 and counted.  Malformed requests get 400, headers
/// over the limit 431, bodies over it 413; a client silent for
/// `read_timeout_ms` is disconnected.  The I/O thread never waits for the
/// actor: a one-shot CAF actor asks it and posts the answer back, after at
/// most `answer_timeout_ms` (then 503), so a slow answer holds up no other
/// connection.
///
/// The web dashboard (docs/control.md): GET /?token=TOKEN answers 303 to /
/// with an HttpOnly, SameSite=Strict cookie tandem_session_PORT holding a
/// session secret of this server, not the token (the URL drops it); GET / with the cookie serves the page (dashboard_page(), a fresh
/// CSRF token and script nonce each time); GET requests and the WebSocket
/// /v1/ws may authenticate with the cookie, a POST with the cookie also
/// needs the page's CSRF token (X-Tandem-CSRF); a request with an Origin
/// header must come from this endpoint's own origin (403 otherwise).  The
/// WebSocket answers each client message {"steps_after", "events_after"}
/// with one frame, at most one a second: GET /v1/dashboard's answer.

#include <cstdint>
#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "messages/control.hpp"

namespace tandem {

struct control_server_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;            ///< 0: any free port (port() says which)
  std::string token;            ///< what `Authorization: Bearer` must carry
  std::string tls_cert;         ///< PEM certificate chain; with tls_key: TLS on every connection
  std::string tls_key;          ///< PEM private key
  size_t header_limit = 8 * 1024;
  size_t body_limit = 64 * 1024;
  int64_t read_timeout_ms = 10000;
  int64_t answer_timeout_ms = 10000;
};

class control_server {
 public:
  /// Binds and starts serving; throws std::runtime_error naming the
  /// address when it cannot bind.
  control_server(caf::actor_system& sys, control_actor actor, control_server_options opts);
  ~control_server();
  control_server(const control_server&) = delete;
  control_server& operator=(const control_server&) = delete;

  /// The bound port.
  uint16_t port() const;
  /// Stops accepting, drops the connections and joins the I/O thread.
  void stop();

  struct impl;  ///< the I/O thread's side (control_http.cpp)

 private:
  std::unique_ptr<impl> impl_;
};

/// The dashboard's page, with @NONCE@ and @CSRF@ to fill in (dashboard_page.cpp).
const char* dashboard_page();

/// A fresh random token: 32 bytes from the OS, as 64 hex digits.
std::string random_token();

/// Constant-time comparison (the time depends only on the lengths).
bool same_token(const std::string& a, const std::string& b);

} // namespace tandem
