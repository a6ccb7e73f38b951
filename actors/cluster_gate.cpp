// The gate before a cluster leader's CAF port and its member-side connector
// (actors/cluster_gate.hpp).  Boost.Asio on one I/O thread per object.
#include "actors/cluster_gate.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <spdlog/spdlog.h>

#include "actors/cluster.hpp"
#include "actors/control_http.hpp"  // random_token, same_token
#include "launch/run_config.hpp"    // valid_node_name

namespace tandem {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr const char* gate_magic = "tandem-gate/1";
constexpr size_t max_line = 256;

/// Copies bytes between two sockets until either side closes.
struct splice : std::enable_shared_from_this<splice> {
  tcp::socket a, b;
  std::array<char, 64 * 1024> ab{}, ba{};
  splice(tcp::socket x, tcp::socket y) : a(std::move(x)), b(std::move(y)) {}
  void start(std::string a_leftover, std::string b_leftover) {
    auto self = shared_from_this();
    // Bytes a line read took past its newline belong to the stream.
    auto go = [self] {
      self->pump(self->a, self->b, self->ab);
      self->pump(self->b, self->a, self->ba);
    };
    auto rest_a = std::make_shared<std::string>(std::move(a_leftover));
    auto rest_b = std::make_shared<std::string>(std::move(b_leftover));
    auto after_b = [self, rest_b, go](const boost::system::error_code& ec, size_t) {
      if (ec) {
        self->close();
        return;
      }
      if (rest_b->empty()) {
        go();
        return;
      }
      asio::async_write(self->a, asio::buffer(*rest_b), [self, rest_b, go](const boost::system::error_code& e, size_t) {
        if (e)
          self->close();
        else
          go();
      });
    };
    if (rest_a->empty())
      after_b({}, 0);
    else
      asio::async_write(b, asio::buffer(*rest_a), [rest_a, after_b](const boost::system::error_code& e, size_t n) {
        after_b(e, n);
      });
  }
  void pump(tcp::socket& from, tcp::socket& to, std::array<char, 64 * 1024>& buf) {
    auto self = shared_from_this();
    from.async_read_some(asio::buffer(buf), [self, &from, &to, &buf](const boost::system::error_code& ec, size_t n) {
      if (ec) {
        self->close();
        return;
      }
      asio::async_write(to, asio::buffer(buf.data(), n), [self, &from, &to, &buf](const boost::system::error_code& e, size_t) {
        if (e) {
          self->close();
          return;
        }
        self->pump(from, to, buf);
      });
    });
  }
  void close() {
    boost::system::error_code ignored;
    a.close(ignored);
    b.close(ignored);
  }
};

/// The text of a line read into `buf` (without its newline), consumed;
/// the bytes after it in `rest`, left in `buf` for a next line read.
std::string take_line(asio::streambuf& buf, size_t n, std::string& rest) {
  std::string all(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data()));
  std::string line = all.substr(0, n > 0 ? n - 1 : 0);
  rest = all.substr(n);
  buf.consume(n);
  if (!line.empty() && line.back() == '\r')
    line.pop_back();
  return line;
}

} // namespace

std::string gate_proof(const std::string& token_hex, const std::string& nonce_hex) {
  return hmac_sha256_hex(token_hex, nonce_hex);
}

// ------------------------------------------------------------------ gate --

struct cluster_gate::impl : std::enable_shared_from_this<cluster_gate::impl> {
  gate_options opts;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::atomic<size_t> pending{0};
  std::atomic<uint64_t> refused{0};

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket peer) {
      if (ec) {
        if (ec != asio::error::operation_aborted)
          self->accept();
        return;
      }
      if (self->pending.load() >= self->opts.max_pending) {
        ++self->refused;  // over the limit: closed at once
        boost::system::error_code ignored;
        peer.close(ignored);
      } else {
        self->handshake(std::make_shared<tcp::socket>(std::move(peer)));
      }
      self->accept();
    });
  }

  void handshake(std::shared_ptr<tcp::socket> peer) {
    auto self = shared_from_this();
    ++pending;
    struct state {
      std::string nonce = random_token().substr(0, 32);
      asio::streambuf buf{max_line};
      asio::steady_timer timer;
      bool done = false;
      explicit state(asio::io_context& io) : timer(io) {}
    };
    auto st = std::make_shared<state>(io);
    auto finish = [self, st, peer](const std::string& refusal) {
      if (st->done)
        return false;
      st->done = true;
      --self->pending;
      st->timer.cancel();
      if (!refusal.empty()) {
        ++self->refused;
        auto text = std::make_shared<std::string>("no " + refusal + "\n");
        asio::async_write(*peer, asio::buffer(*text), [peer, text](const boost::system::error_code&, size_t) {
          boost::system::error_code ignored;
          peer->close(ignored);
        });
      }
      return true;
    };
    st->timer.expires_after(std::chrono::milliseconds(opts.handshake_ms));
    st->timer.async_wait([finish, peer](const boost::system::error_code& ec) {
      if (!ec && finish("")) {
        boost::system::error_code ignored;
        peer->close(ignored);  // silent past the deadline: no answer
      }
    });
    auto hello = std::make_shared<std::string>(std::string(gate_magic) + " " + st->nonce + "\n");
    asio::async_write(*peer, asio::buffer(*hello), [self, st, peer, hello, finish](const boost::system::error_code& ec,
                                                                                  size_t) {
      if (ec) {
        if (finish("")) {
          boost::system::error_code ignored;
          peer->close(ignored);
        }
        return;
      }
      asio::async_read_until(*peer, st->buf, '\n', [self, st, peer, finish](const boost::system::error_code& e, size_t n) {
        if (e) {  // closed, over the line limit, or the deadline closed it
          if (finish("")) {
            boost::system::error_code ignored;
            peer->close(ignored);
          }
          return;
        }
        std::string rest;
        const auto line = take_line(st->buf, n, rest);
        const auto space = line.find(' ');
        const auto name = line.substr(0, space);
        const auto proof = space == std::string::npos ? std::string() : line.substr(space + 1);
        // A node name and "-" or 64 hex digits, nothing else: random bytes
        // never pass as an answer.
        const bool hex64 = proof.size() == 64 && proof.find_first_not_of("0123456789abcdef") == std::string::npos;
        if (!valid_node_name(name) || (proof != "-" && !hex64)) {
          finish("a malformed answer");
          return;
        }
        if (!self->opts.secret_hex.empty()) {
          std::string want;
          try {
            want = gate_proof(join_token(self->opts.secret_hex, name), st->nonce);
          } catch (const std::exception& x) {
            finish(std::string("the leader cannot check proofs: ") + x.what());
            return;
          }
          if (!same_token(want, proof)) {
            spdlog::warn("cluster gate: '{}' refused: {} join token", name, proof == "-" ? "no" : "a wrong");
            finish(proof == "-" ? "no join token (the leader checks cluster.secret; give --token-file)"
                                : "a wrong join token");
            return;
          }
        }
        if (!finish(""))
          return;
        // Through: to the leader's CAF on loopback.
        auto inner = std::make_shared<tcp::socket>(self->io);
        tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), self->opts.inner_port);
        inner->async_connect(ep, [self, peer, inner, rest](const boost::system::error_code& ce) {
          if (ce) {
            boost::system::error_code ignored;
            peer->close(ignored);
            return;
          }
          auto ok = std::make_shared<std::string>("ok\n");
          asio::async_write(*peer, asio::buffer(*ok), [peer, inner, ok, rest](const boost::system::error_code& we, size_t) {
            if (we) {
              boost::system::error_code ignored;
              peer->close(ignored);
              inner->close(ignored);
              return;
            }
            std::make_shared<splice>(std::move(*peer), std::move(*inner))->start(rest, "");
          });
        });
      });
    });
  }
};

cluster_gate::cluster_gate(gate_options opts) : impl_(std::make_shared<impl>()) {
  impl_->opts = std::move(opts);
  try {
    tcp::endpoint ep(asio::ip::make_address(impl_->opts.host == "localhost" ? "127.0.0.1" : impl_->opts.host),
                     impl_->opts.port);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(static_cast<int>(impl_->opts.max_pending));
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot listen on " + impl_->opts.host + ":" + std::to_string(impl_->opts.port) + ": "
                             + e.what());
  }
  impl_->accept();
  impl_->thread = std::thread([i = impl_] { i->io.run(); });
}

cluster_gate::~cluster_gate() { stop(); }

uint16_t cluster_gate::port() const { return impl_->acceptor.local_endpoint().port(); }
uint64_t cluster_gate::refused() const { return impl_->refused.load(); }

void cluster_gate::stop() {
  if (!impl_ || !impl_->thread.joinable())
    return;
  impl_->io.stop();
  impl_->thread.join();
}

// ------------------------------------------------------------- connector --

struct gate_connector::impl : std::enable_shared_from_this<gate_connector::impl> {
  connector_options opts;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  mutable std::mutex mutex;
  std::string refusal;
  std::string trouble;  ///< why the last connection did not reach the gate's answer ("" = it did)
  uint64_t passed = 0;  ///< connections the gate let through

  void accept() {
    auto self = shared_from_this();
    acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket local) {
      if (ec) {
        if (ec != asio::error::operation_aborted)
          self->accept();
        return;
      }
      self->dial(std::make_shared<tcp::socket>(std::move(local)));
      self->accept();
    });
  }

  void dial(std::shared_ptr<tcp::socket> local) {
    auto self = shared_from_this();
    auto remote = std::make_shared<tcp::socket>(io);
    auto resolver = std::make_shared<tcp::resolver>(io);
    auto buf = std::make_shared<asio::streambuf>(max_line);
    auto drop = [local, remote] {
      boost::system::error_code ignored;
      local->close(ignored);
      remote->close(ignored);
    };
    const auto where = opts.gate_host + ":" + std::to_string(opts.gate_port);
    auto trouble = [self, drop](std::string why) {
      {
        std::lock_guard<std::mutex> lock(self->mutex);
        self->trouble = std::move(why);
      }
      drop();
    };
    resolver->async_resolve(opts.gate_host, std::to_string(opts.gate_port), [=](const boost::system::error_code& ec,
                                                                                 tcp::resolver::results_type r) {
      (void)resolver;  // kept alive until it has answered
      if (ec) {
        trouble("cannot resolve " + self->opts.gate_host + ": " + ec.message());
        return;
      }
      asio::async_connect(*remote, r, [=](const boost::system::error_code& ce, const tcp::endpoint&) {
        if (ce) {
          trouble("cannot connect to " + where + ": " + ce.message());
          return;
        }
        asio::async_read_until(*remote, *buf, '\n', [=](const boost::system::error_code& re, size_t n) {
          if (re) {
            trouble(where + " closed the connection before its gate greeted this node (" + re.message() + ")");
            return;
          }
          std::string rest;
          const auto line = take_line(*buf, n, rest);
          const std::string magic = std::string(gate_magic) + " ";
          if (line.rfind(magic, 0) != 0) {
            self->refused("the leader's port does not speak " + std::string(gate_magic));
            drop();
            return;
          }
          const auto nonce = line.substr(magic.size());
          std::string proof = "-";
          if (!self->opts.token_hex.empty()) {
            try {
              proof = gate_proof(self->opts.token_hex, nonce);
            } catch (const std::exception& x) {
              self->refused(x.what());
              drop();
              return;
            }
          }
          auto answer = std::make_shared<std::string>(self->opts.name + " " + proof + "\n");
          asio::async_write(*remote, asio::buffer(*answer), [=](const boost::system::error_code& we, size_t) {
            if (we) {
              drop();
              return;
            }
            asio::async_read_until(*remote, *buf, '\n', [=](const boost::system::error_code& e2, size_t n2) {
              if (e2) {
                drop();
                return;
              }
              std::string after;
              const auto reply = take_line(*buf, n2, after);
              if (reply != "ok") {
                self->refused(reply.rfind("no ", 0) == 0 ? reply.substr(3) : "an unexpected answer: " + reply);
                drop();
                return;
              }
              {
                std::lock_guard<std::mutex> lock(self->mutex);
                self->refusal.clear();
                self->trouble.clear();
                ++self->passed;
              }
              std::make_shared<splice>(std::move(*remote), std::move(*local))->start(after, "");
            });
          });
        });
      });
    });
  }

  void refused(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    refusal = why;
  }
};

gate_connector::gate_connector(connector_options opts) : impl_(std::make_shared<impl>()) {
  impl_->opts = std::move(opts);
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.bind(ep);
  impl_->acceptor.listen();
  impl_->accept();
  impl_->thread = std::thread([i = impl_] { i->io.run(); });
}

gate_connector::~gate_connector() { stop(); }

uint16_t gate_connector::port() const { return impl_->acceptor.local_endpoint().port(); }

std::string gate_connector::refusal() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->refusal;
}

std::string gate_connector::trouble() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->trouble;
}

uint64_t gate_connector::passed() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->passed;
}

void gate_connector::stop() {
  if (!impl_ || !impl_->thread.joinable())
    return;
  impl_->io.stop();
  impl_->thread.join();
}

} // namespace tandem
