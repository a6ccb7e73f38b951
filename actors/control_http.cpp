#include "actors/control_http.hpp"

#include <atomic>
#include <chrono>
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
#ifdef TANDEM_HAVE_TLS
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#endif
#include <caf/scoped_actor.hpp>
#include <nlohmann/json.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

namespace tandem {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
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
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::optional<caf::scoped_actor> asker;  ///< lives on the I/O thread
  std::atomic<bool> stopped{false};
  uint16_t port = 0;  ///< bound
#ifdef TANDEM_HAVE_TLS
  std::optional<net::ssl::context> tls;  ///< set: every connection is TLS
#endif

  impl(caf::actor_system& s, control_actor a, control_server_options o)
    : sys(s), actor(std::move(a)), opts(std::move(o)) {}

  void accept();
  /// The answer to one complete request (on the I/O thread).
  http::response<http::string_body> answer(const http::request<http::string_body>& req, const std::string& peer);
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
    auto res = server_.answer(req, peer_);
    const bool keep = req.keep_alive() && !server_.stopped.load();
    write(std::move(res), keep);
  }

  void write(http::response<http::string_body> res, bool keep) {
    res_ = std::make_shared<http::response<http::string_body>>(std::move(res));
    res_->keep_alive(keep);
    res_->prepare_payload();
    beast::get_lowest_layer(stream_).expires_after(std::chrono::milliseconds(server_.opts.read_timeout_ms));
    http::async_write(stream_, *res_, [self = this->shared_from_this(), keep](beast::error_code ec, size_t) {
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

http::response<http::string_body> control_server::impl::answer(const http::request<http::string_body>& req,
                                                                 const std::string& peer) {
  const auto version = req.version();
  const auto agent = std::string(req[http::field::user_agent]);
  const auto source = peer + (agent.empty() ? "" : " " + agent.substr(0, 64));
  const auto auth = std::string(req[http::field::authorization]);
  static const std::string bearer = "Bearer ";
  const bool authorized = auth.size() > bearer.size() && auth.compare(0, bearer.size(), bearer) == 0
                          && same_token(auth.substr(bearer.size()), opts.token);
  if (!authorized) {
    caf::anon_send(actor, unauthorized_atom::value, source);
    auto res = json_response(version, 401, error_body(auth.empty() ? "this endpoint needs the run's token "
                                                                     "(Authorization: Bearer TOKEN; RUN_DIR/control.json)"
                                                                   : "wrong token"));
    res.set(http::field::www_authenticate, "Bearer");
    return res;
  }
  if (req.method() != http::verb::get && req.method() != http::verb::post)
    return json_response(version, 405, error_body(std::string(req.method_string()) + ": only GET and POST"));
  control_request cr{std::string(req.method_string()), std::string(req.target()), req.body(), source};
  int status = 503;
  std::string body = error_body("the control actor did not answer");
  std::string content_type = "application/json";
  (*asker)
    ->request(actor, std::chrono::milliseconds(opts.answer_timeout_ms), std::move(cr))
    .receive(
      [&](control_reply& r) {
        status = r.status;
        body = std::move(r.body);
        content_type = std::move(r.content_type);
      },
      [&](caf::error& err) { body = error_body("the control actor did not answer: " + sys.render(err)); });
  return json_response(version, status, std::move(body), content_type);
}

control_server::control_server(caf::actor_system& sys, control_actor actor, control_server_options opts)
  : impl_(std::make_unique<impl>(sys, std::move(actor), std::move(opts))) {
  auto& m = *impl_;
  if (!m.opts.tls_cert.empty() || !m.opts.tls_key.empty()) {
#ifdef TANDEM_HAVE_TLS
    m.tls.emplace(net::ssl::context::tls_server);
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
    m.asker.emplace(m.sys);
    try {
      m.io.run();
    } catch (const std::exception& e) {
      spdlog::error("control endpoint: the I/O thread ended: {}", e.what());
    }
    m.asker.reset();
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
  net::post(m.io, [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
  });
  m.io.stop();
  if (m.thread.joinable())
    m.thread.join();
}

} // namespace tandem
