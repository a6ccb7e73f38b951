#include "actors/control_http.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/asio/steady_timer.hpp>
#ifdef TANDEM_HAVE_TLS
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket/ssl.hpp>
#endif
#include <caf/event_based_actor.hpp>
#include <nlohmann/json.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

namespace tandem {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

std::string random_token() {
  std::random_device rd;  // /dev/urandom on Linux
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 8; ++i) {
    uint32_t w = rd();
    for (int k = 0; k < 8; ++k, w >>= 4)
      t.push_back(hex[w & 0xf]);
  }
  return t;
}

bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size())
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

struct control_server::impl {
  caf::actor_system& sys;
  control_actor actor;
  control_server_options opts;
  /// Shared with the one-shot askers (ask): an answer that comes after the
  /// server stopped is posted to a context that never runs it again.
  std::shared_ptr<net::io_context> io = std::make_shared<net::io_context>(1);
  tcp::acceptor acceptor{*io};
  std::thread thread;
  std::atomic<bool> stopped{false};
  /// HTTP requests asked of the control actor whose answer is not written
  /// yet: stop() lets them finish (a POST /v1/stop gets its answer).
  std::atomic<int> in_flight{0};
  uint16_t port = 0;  ///< bound
#ifdef TANDEM_HAVE_TLS
  std::optional<net::ssl::context> tls;  ///< set: every connection is TLS
#endif

  impl(caf::actor_system& s, control_actor a, control_server_options o)
    : sys(s), actor(std::move(a)), opts(std::move(o)) {}

  bool secure = false;  ///< TLS: the dashboard's cookie is Secure
  /// The dashboard's cookie holds this, never the run's token: a browser
  /// sends a host's cookies to every port of it, so the cookie names the
  /// port (two runs' dashboards on one host keep their own) and a leak
  /// grants this endpoint's dashboard, not the token of control.json.
  const std::string session_secret = random_token();
  std::string cookie_name() const { return "tandem_session_" + std::to_string(port); }
  /// The CSRF tokens of the last pages served (I/O thread only).
  std::deque<std::string> csrf_tokens;

  void accept();
  using response = http::response<http::string_body>;
  /// Answers one complete request: `done(response)` on the I/O thread, at
  /// once or when the control actor answers (the thread never waits for
  /// it, so one slow answer holds up no other connection).
  void answer(const http::request<http::string_body>& req, const std::string& peer,
              std::function<void(response)> done);

  /// The control actor's answer to `cr`: `done(asked)` on the I/O thread,
  /// after at most answer_timeout_ms.
  struct asked {
    int status;
    std::string body;
    std::string content_type;
  };
  void ask(control_request cr, std::function<void(asked)> done);
  /// The answer to a request the server settles itself (the door, the
  /// token, the CSRF check, a refused method); nullopt: the actor's.
  std::optional<response> answer_now(const http::request<http::string_body>& req, const std::string& peer);

  enum class auth { none, bearer, cookie };
  /// The bearer header, else the dashboard's cookie.
  auth authenticate(const http::request<http::string_body>& req) const;
  /// No Origin header, or this endpoint's own (scheme://Host).
  bool same_origin(const http::request<http::string_body>& req) const;
  std::string source_of(const http::request<http::string_body>& req, const std::string& peer) const;
};

namespace {

http::response<http::string_body> json_response(unsigned version, int status, std::string body,
                                                const std::string& content_type = "application/json") {
  http::response<http::string_body> res{static_cast<http::status>(status), version};
  res.set(http::field::server, "tandem");
  res.set(http::field::content_type, content_type);
  res.set(http::field::cache_control, "no-store");
  res.body() = std::move(body);
  if (!res.body().empty() && res.body().back() != '\n')
    res.body().push_back('\n');
  return res;
}

std::string error_body(const std::string& what) {
  return nlohmann::json{{"error", what}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// The dashboard's WebSocket (/v1/ws): each client message
/// {"steps_after": N, "events_after": M} is answered with one text frame,
/// GET /v1/dashboard's answer, at most one a second.
template <class Stream>
class ws_session : public std::enable_shared_from_this<ws_session<Stream>> {
 public:
  ws_session(Stream&& stream, control_server::impl& server, std::string source)
    : ws_(std::move(stream)), timer_(ws_.get_executor()), server_(server), source_(std::move(source)) {}

  void run(http::request<http::string_body> req) {
    beast::get_lowest_layer(ws_).expires_never();  // the WebSocket's own timeouts from here on
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.read_message_max(4096);
    ws_.async_accept(req, [self = this->shared_from_this()](beast::error_code ec) {
      if (!ec)
        self->read();
    });
  }

 private:
  void read() {
    buffer_.clear();
    ws_.async_read(buffer_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      if (ec || self->server_.stopped.load())
        return;  // closed by the client (or the run ended): the session ends
      auto ask = nlohmann::json::parse(beast::buffers_to_string(self->buffer_.data()), nullptr, false);
      int64_t steps = 0, events = 0;
      // Only integers are read: anything else counts as 0 (never a throw
      // on the I/O thread).
      auto field = [&](const char* key) {
        return ask.is_object() && ask.contains(key) && ask[key].is_number_integer()
                 ? std::max<int64_t>(0, ask[key].template get<int64_t>()) : int64_t{0};
      };
      steps = field("steps_after");
      events = field("events_after");
      self->target_ = "/v1/dashboard?steps_after=" + std::to_string(steps) + "&events_after=" + std::to_string(events);
      const auto since = std::chrono::steady_clock::now() - self->last_;
      self->timer_.expires_after(self->first_ ? std::chrono::steady_clock::duration::zero()
                                              : std::max<std::chrono::steady_clock::duration>(
                                                  std::chrono::steady_clock::duration::zero(), std::chrono::seconds(1) - since));
      self->first_ = false;
      self->timer_.async_wait([self](beast::error_code ec) {
        if (!ec)
          self->push();
      });
    });
  }

  // Not counted in server_.in_flight: stop() waits for answers to requests
  // (a POST /v1/stop's), not for a dashboard's next frame, whose write a
  // stalled client may never take.
  void push() {
    last_ = std::chrono::steady_clock::now();
    server_.ask({"GET", target_, "", source_}, [self = this->shared_from_this()](control_server::impl::asked a) {
      self->frame_ = a.status == 200 ? std::move(a.body) : nlohmann::json{{"error", a.body}}.dump();
      self->ws_.text(true);
      self->ws_.async_write(net::buffer(self->frame_), [self](beast::error_code ec, size_t) {
        if (!ec)
          self->read();
      });
    });
  }

  websocket::stream<Stream> ws_;
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  control_server::impl& server_;
  std::string source_, target_, frame_;
  std::chrono::steady_clock::time_point last_{};
  bool first_ = true;
};

/// One connection: requests read and answered in turn (keep-alive).
/// `Stream`: beast::tcp_stream, or an ssl_stream over one (TLS).
template <class Stream>
class session : public std::enable_shared_from_this<session<Stream>> {
 public:
  template <class... Args>
  session(control_server::impl& server, tcp::socket socket, Args&&... args)
    : stream_(std::move(socket), std::forward<Args>(args)...), server_(server) {
    beast::error_code ec;
    const auto ep = beast::get_lowest_layer(stream_).socket().remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  void start() {
#ifdef TANDEM_HAVE_TLS
    if constexpr (!std::is_same_v<Stream, beast::tcp_stream>) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::milliseconds(server_.opts.read_timeout_ms));
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  self->close();  // not TLS, or a certificate the client refused
                                  return;
                                }
                                self->read();
                              });
      return;
    }
#endif
    read();
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.opts.header_limit));
    parser_->body_limit(server_.opts.body_limit);
    beast::get_lowest_layer(stream_).expires_after(std::chrono::milliseconds(server_.opts.read_timeout_ms));
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted
        || ec == net::error::connection_reset || ec == net::error::eof) {
      close();
      return;
    }
    if (ec) {
      // Malformed: answer once, then close (the stream's framing is lost).
      int status = 400;
      if (ec == http::error::header_limit)
        status = 431;
      else if (ec == http::error::body_limit)
        status = 413;
      write(json_response(11, status, error_body("bad request: " + ec.message())), false);
      return;
    }
    const auto& req = parser_->get();
    if (websocket::is_upgrade(req)) {
      const auto target = std::string(req.target());
      const bool known = target.substr(0, target.find('?')) == "/v1/ws";
      const bool origin = server_.same_origin(req);
      const bool authorized = server_.authenticate(req) != control_server::impl::auth::none;
      if (known && origin && authorized) {
        std::make_shared<ws_session<Stream>>(std::move(stream_), server_, server_.source_of(req, peer_) + " (websocket)")
          ->run(parser_->release());
        return;  // this session ends; the WebSocket's owns the connection
      }
      if (known && origin)
        caf::anon_send(server_.actor, unauthorized_atom::value, server_.source_of(req, peer_));
      write(!known    ? json_response(req.version(), 404, error_body("no WebSocket at " + target + " (/v1/ws)"))
            : !origin ? json_response(req.version(), 403, error_body("cross-origin WebSocket refused (Origin "
                                                                     + std::string(req[http::field::origin]) + ")"))
                      : json_response(req.version(), 401, error_body("the WebSocket /v1/ws needs the run's token "
                                                                     "(bearer, or the dashboard's cookie)")),
            false);
      return;
    }
    const bool keep = req.keep_alive();
    ++server_.in_flight;
    server_.answer(req, peer_, [self = this->shared_from_this(), keep](http::response<http::string_body> res) {
      self->write(std::move(res), keep && !self->server_.stopped.load(), true);
    });
  }

  /// `counted`: the answer to a request counted in server_.in_flight.
  void write(http::response<http::string_body> res, bool keep, bool counted = false) {
    res_ = std::make_shared<http::response<http::string_body>>(std::move(res));
    res_->keep_alive(keep);
    res_->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(std::chrono::milliseconds(server_.opts.read_timeout_ms));
    http::async_write(stream_, *res_, [self = this->shared_from_this(), keep, counted](beast::error_code ec, size_t) {
      if (counted)
        --self->server_.in_flight;
      if (ec || !keep) {
        self->close();
        return;
      }
      self->read();
    });
  }

  void close() {
    beast::error_code ec;
    auto& socket = beast::get_lowest_layer(stream_).socket();
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<http::response<http::string_body>> res_;
  control_server::impl& server_;
  std::string peer_;
};

} // namespace

void control_server::impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!stopped.load() && ec != net::error::operation_aborted) {
        spdlog::warn("control endpoint: accept failed: {}", ec.message());
        accept();
      }
      return;
    }
#ifdef TANDEM_HAVE_TLS
    if (tls) {
      std::make_shared<session<beast::ssl_stream<beast::tcp_stream>>>(*this, std::move(socket), *tls)->start();
      accept();
      return;
    }
#endif
    std::make_shared<session<beast::tcp_stream>>(*this, std::move(socket))->start();
    accept();
  });
}

void control_server::impl::ask(control_request cr, std::function<void(asked)> done) {
  // A one-shot actor asks; its answer comes back to the I/O thread.  It
  // holds nothing of this server but the I/O context (it may answer after
  // the server is gone).
  sys.spawn([io = io, to = actor, wait = std::chrono::milliseconds(opts.answer_timeout_ms), cr = std::move(cr),
             done = std::move(done)](caf::event_based_actor* me) mutable {
    me->request(to, wait, std::move(cr))
      .then(
        [io, me, done](control_reply& r) {
          net::post(*io, [done, a = asked{r.status, std::move(r.body), std::move(r.content_type)}]() mutable {
            done(std::move(a));
          });
          me->quit();
        },
        [io, me, done](caf::error& err) {
          net::post(*io, [done, a = asked{503, error_body("the control actor did not answer: " + me->system().render(err)),
                                          "application/json"}]() mutable { done(std::move(a)); });
          me->quit();
        });
  });
}

namespace {

/// The value of cookie `name` in the request's Cookie header ("" if none).
std::string cookie(const http::request<http::string_body>& req, const std::string& name) {
  const auto header = std::string(req[http::field::cookie]);
  size_t i = 0;
  while (i < header.size()) {
    while (i < header.size() && (header[i] == ' ' || header[i] == ';'))
      ++i;
    const auto end = header.find(';', i);
    const auto pair = header.substr(i, end == std::string::npos ? std::string::npos : end - i);
    const auto eq = pair.find('=');
    if (eq != std::string::npos && pair.substr(0, eq) == name)
      return pair.substr(eq + 1);
    if (end == std::string::npos)
      break;
    i = end + 1;
  }
  return {};
}

/// The query parameter `key` of a target ("" if none).
std::string query_param(const std::string& target, const std::string& key) {
  const auto q = target.find('?');
  if (q == std::string::npos)
    return {};
  const auto rest = target.substr(q + 1);
  size_t i = 0;
  while (i <= rest.size()) {
    auto j = rest.find('&', i);
    if (j == std::string::npos)
      j = rest.size();
    const auto kv = rest.substr(i, j - i);
    if (kv.rfind(key + "=", 0) == 0)
      return kv.substr(key.size() + 1);
    i = j + 1;
  }
  return {};
}

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size()))
    s.replace(at, what.size(), with);
}

http::response<http::string_body> html_response(unsigned version, int status, std::string body) {
  http::response<http::string_body> res{static_cast<http::status>(status), version};
  res.set(http::field::server, "tandem");
  res.set(http::field::content_type, "text/html; charset=utf-8");
  res.set(http::field::cache_control, "no-store");
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Referrer-Policy", "no-referrer");
  res.set("X-Frame-Options", "DENY");
  res.body() = std::move(body);
  return res;
}

} // namespace

control_server::impl::auth control_server::impl::authenticate(const http::request<http::string_body>& req) const {
  const auto header = std::string(req[http::field::authorization]);
  static const std::string bearer = "Bearer ";
  if (header.size() > bearer.size() && header.compare(0, bearer.size(), bearer) == 0
      && same_token(header.substr(bearer.size()), opts.token))
    return auth::bearer;
  const auto c = cookie(req, cookie_name());
  if (!c.empty() && same_token(c, session_secret))
    return auth::cookie;
  return auth::none;
}

bool control_server::impl::same_origin(const http::request<http::string_body>& req) const {
  const auto origin = std::string(req[http::field::origin]);
  if (origin.empty())
    return true;  // not a browser's cross-site request
  const auto host = std::string(req[http::field::host]);
#ifdef TANDEM_HAVE_TLS
  const std::string scheme = tls ? "https://" : "http://";
#else
  const std::string scheme = "http://";
#endif
  return !host.empty() && origin == scheme + host;
}

std::string control_server::impl::source_of(const http::request<http::string_body>& req,
                                            const std::string& peer) const {
  const auto agent = std::string(req[http::field::user_agent]);
  return peer + (agent.empty() ? "" : " " + agent.substr(0, 64));
}

void control_server::impl::answer(const http::request<http::string_body>& req, const std::string& peer,
                                  std::function<void(response)> done) {
  if (auto now = answer_now(req, peer)) {
    done(std::move(*now));
    return;
  }
  ask({std::string(req.method_string()), std::string(req.target()), req.body(), source_of(req, peer)},
      [done = std::move(done), version = req.version()](asked a) {
        done(json_response(version, a.status, std::move(a.body), a.content_type));
      });
}

std::optional<control_server::impl::response>
control_server::impl::answer_now(const http::request<http::string_body>& req, const std::string& peer) {
  const auto version = req.version();
  const auto source = source_of(req, peer);
  const auto target = std::string(req.target());
  const auto path = target.substr(0, target.find('?'));
  if (!same_origin(req))
    return json_response(version, 403, error_body("cross-origin request refused (Origin "
                                                  + std::string(req[http::field::origin]) + ")"));
  // The dashboard's door: the token once in the URL, then a cookie.
  if (req.method() == http::verb::get && (path == "/" || path == "/index.html")) {
    const auto given = query_param(target, "token");
    if (!given.empty()) {
      if (!same_token(given, opts.token)) {
        caf::anon_send(actor, unauthorized_atom::value, source);
        return html_response(version, 401, "<!DOCTYPE html><title>tandem</title><p>Wrong token.</p>\n");
      }
      auto res = html_response(version, 303, "");
      res.set(http::field::location, "/");
      res.set(http::field::set_cookie, cookie_name() + "=" + session_secret + "; HttpOnly; SameSite=Strict; Path=/"
                                         + std::string(secure ? "; Secure" : ""));
      return res;
    }
    if (authenticate(req) == auth::none) {
      caf::anon_send(actor, unauthorized_atom::value, source);
      return html_response(version, 401, "<!DOCTYPE html><title>tandem</title><p>This run's dashboard needs its "
                                         "token: open the address <code>tandem shell RUN_DIR -c dashboard</code> "
                                         "prints (it holds <code>?token=</code> once).</p>\n");
    }
    const auto nonce = random_token().substr(0, 32);
    const auto csrf = random_token();
    csrf_tokens.push_back(csrf);
    while (csrf_tokens.size() > 256)
      csrf_tokens.pop_front();
    std::string page = dashboard_page();
    replace_all(page, "@NONCE@", nonce);
    replace_all(page, "@CSRF@", csrf);
    auto res = html_response(version, 200, std::move(page));
    res.set("Content-Security-Policy", "default-src 'none'; script-src 'nonce-" + nonce + "'; style-src 'nonce-"
                                         + nonce + "'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                         "form-action 'none'; frame-ancestors 'none'");
    return res;
  }
  const auto how = authenticate(req);
  if (how == auth::none) {
    caf::anon_send(actor, unauthorized_atom::value, source);
    const auto header = std::string(req[http::field::authorization]);
    auto res = json_response(version, 401, error_body(header.empty() ? "this endpoint needs the run's token "
                                                                       "(Authorization: Bearer TOKEN; RUN_DIR/control.json)"
                                                                     : "wrong token"));
    res.set(http::field::www_authenticate, "Bearer");
    return res;
  }
  if (req.method() != http::verb::get && req.method() != http::verb::post)
    return json_response(version, 405, error_body(std::string(req.method_string()) + ": only GET and POST"));
  if (how == auth::cookie && req.method() != http::verb::get) {
    // The cookie goes with any request the browser makes: an action also
    // needs what only the dashboard's own page knows.
    const auto csrf = std::string(req["X-Tandem-CSRF"]);
    const bool known = !csrf.empty() && std::any_of(csrf_tokens.begin(), csrf_tokens.end(),
                                                    [&](const std::string& t) { return same_token(t, csrf); });
    if (!known)
      return json_response(version, 403, error_body("an action with the dashboard's cookie needs its page's "
                                                    "CSRF token (X-Tandem-CSRF), or use the bearer token"));
  }
  return std::nullopt;  // the control actor's to answer
}

control_server::control_server(caf::actor_system& sys, control_actor actor, control_server_options opts)
  : impl_(std::make_unique<impl>(sys, std::move(actor), std::move(opts))) {
  auto& m = *impl_;
  if (!m.opts.tls_cert.empty() || !m.opts.tls_key.empty()) {
#ifdef TANDEM_HAVE_TLS
    m.tls.emplace(net::ssl::context::tls_server);
    m.secure = true;
    m.tls->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2
                       | net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1
                       | net::ssl::context::no_tlsv1_1);
    beast::error_code tls_ec;
    m.tls->use_certificate_chain_file(m.opts.tls_cert, tls_ec);
    if (tls_ec)
      throw std::runtime_error("control endpoint: control.tls_cert " + m.opts.tls_cert
                               + ": not a PEM certificate chain (" + tls_ec.message() + ")");
    m.tls->use_private_key_file(m.opts.tls_key, net::ssl::context::pem, tls_ec);
    if (tls_ec)
      throw std::runtime_error("control endpoint: control.tls_key " + m.opts.tls_key
                               + ": not the PEM private key of control.tls_cert (" + tls_ec.message() + ")");
#else
    throw std::runtime_error("control endpoint: control.tls_cert/tls_key are set, but this build has no TLS "
                             "(OpenSSL: libssl-dev was missing when it was configured)");
#endif
  }
  beast::error_code ec;
  const auto address = net::ip::make_address(m.opts.host, ec);
  if (ec)
    throw std::runtime_error("control endpoint: '" + m.opts.host + "' is not an IP address: " + ec.message());
  const tcp::endpoint ep{address, m.opts.port};
  m.acceptor.open(ep.protocol(), ec);
  if (!ec)
    m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    m.acceptor.bind(ep, ec);
  if (!ec)
    m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("control endpoint: cannot listen on " + m.opts.host + ":" + std::to_string(m.opts.port)
                             + ": " + ec.message() + " (control.listen)");
  m.port = m.acceptor.local_endpoint().port();
  m.accept();
  m.thread = std::thread([&m] {
    try {
      m.io->run();
    } catch (const std::exception& e) {
      spdlog::error("control endpoint: the I/O thread ended: {}", e.what());
    }
  });
}

control_server::~control_server() {
  stop();
}

uint16_t control_server::port() const {
  return impl_->port;
}

void control_server::stop() {
  auto& m = *impl_;
  if (m.stopped.exchange(true))
    return;
  net::post(*m.io, [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
  });
  // The answers under way (a POST /v1/stop's, which ends the run) are
  // written first: 10 s at most (a control actor that is gone answers 503 at
  // once; 2 s were not always enough on two loaded cores: the shell then saw
  // the connection close without its answer).
  for (int i = 0; i < 1000 && m.in_flight.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.io->stop();
  if (m.thread.joinable())
    m.thread.join();
}

} // namespace tandem
