// `tandem shell`: the inspection shell against a running `tandem run`
// (its control endpoint, actors/control_http.hpp; the API is docs/control.md).
#include <poll.h>
#include <termios.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#ifdef TANDEM_HAVE_TLS
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#endif
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "launch/run_config.hpp"

#ifdef TANDEM_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

namespace tandem::cli {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;

struct endpoint {
  std::string host;
  std::string port;
  std::string token;
  std::string where;  ///< for messages: the run folder or HOST:PORT
  std::string token_from;  ///< for messages: --token-file FILE, TANDEM_TOKEN or RUN_DIR/control.json
  bool tls = false;   ///< HTTPS (control.json's "tls", or --ca with HOST:PORT)
  std::string ca;     ///< --ca: the CA file that verifies the endpoint ("": the system's)
};

struct answer {
  int status = 0;      ///< 0: no answer (error says why)
  json body;
  std::string error;
};

/// One exchange over `stream` (plain or TLS, connected): write, read.
template <class Stream>
void exchange(Stream& stream, http::request<http::string_body>& req, beast::flat_buffer& buffer,
              http::response<http::string_body>& res, beast::error_code& failure) {
  http::async_write(stream, req, [&](beast::error_code ec, size_t) {
    if (ec) {
      failure = ec;
      return;
    }
    http::async_read(stream, buffer, res, [&](beast::error_code ec, size_t) { failure = ec; });
  });
}

/// One request; a fresh connection each time (the shell is not a hot path).
answer call(const endpoint& ep, http::verb method, const std::string& target, const std::string& body = "",
            std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  answer a;
  net::io_context io;
  tcp::resolver resolver(io);
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, ep.host);
  req.set(http::field::user_agent, "tandem-shell");
  req.set(http::field::authorization, "Bearer " + ep.token);
  if (method == http::verb::post) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code failure;
#ifdef TANDEM_HAVE_TLS
  std::optional<net::ssl::context> ctx;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_stream;
#endif
  std::optional<beast::tcp_stream> plain;
  if (ep.tls) {
#ifdef TANDEM_HAVE_TLS
    ctx.emplace(net::ssl::context::tls_client);
    beast::error_code ec;
    if (ep.ca.empty())
      ctx->set_default_verify_paths(ec);
    else
      ctx->load_verify_file(ep.ca, ec);
    if (ec) {
      a.error = "--ca " + ep.ca + ": cannot read it as PEM certificates (" + ec.message() + ")";
      return a;
    }
    ctx->set_verify_mode(net::ssl::verify_peer);
    tls_stream.emplace(io, *ctx);
    tls_stream->set_verify_callback(net::ssl::host_name_verification(ep.host));
    beast::error_code ip_ec;
    net::ip::make_address(ep.host, ip_ec);
    if (ip_ec)  // a name, not an address: send it (SNI)
      ::SSL_set_tlsext_host_name(tls_stream->native_handle(), ep.host.c_str());
    beast::get_lowest_layer(*tls_stream).expires_after(timeout);
#else
    a.error = "the endpoint speaks TLS, but this tandem was built without it (OpenSSL)";
    return a;
#endif
  } else {
    plain.emplace(io);
    plain->expires_after(timeout);
  }
  resolver.async_resolve(ep.host, ep.port, [&](beast::error_code ec, tcp::resolver::results_type results) {
    if (ec) {
      failure = ec;
      return;
    }
#ifdef TANDEM_HAVE_TLS
    if (tls_stream) {
      beast::get_lowest_layer(*tls_stream).async_connect(results, [&](beast::error_code ec, const tcp::endpoint&) {
        if (ec) {
          failure = ec;
          return;
        }
        tls_stream->async_handshake(net::ssl::stream_base::client, [&](beast::error_code ec) {
          if (ec) {
            failure = ec;
            return;
          }
          exchange(*tls_stream, req, buffer, res, failure);
        });
      });
      return;
    }
#endif
    plain->async_connect(results, [&](beast::error_code ec, const tcp::endpoint&) {
      if (ec) {
        failure = ec;
        return;
      }
      exchange(*plain, req, buffer, res, failure);
    });
  });
  io.run();
  if (failure) {
    std::string hint;
    if (failure == net::error::connection_refused)
      hint = " (has the run ended?)";
    else if (ep.tls && failure.message().find("certificate") != std::string::npos)
      hint = " (--ca FILE: the CA certificate that signed the endpoint's; its names must include " + ep.host + ")";
    a.error = "the run's control endpoint (" + ep.where + ", " + std::string(ep.tls ? "https://" : "http://") + ep.host
              + ":" + ep.port + ") does not answer: " + failure.message() + hint;
    return a;
  }
  a.status = static_cast<int>(res.result_int());
  a.body = json::parse(res.body(), nullptr, false);
  if (a.body.is_discarded())
    a.body = json{{"error", "not JSON: " + res.body().substr(0, 200)}};
  if (a.status >= 300)
    a.error = a.body.value("error", "HTTP " + std::to_string(a.status));
  if (a.status == 401 && !ep.token_from.empty())
    a.error += " (the token came from " + ep.token_from + ")";
  return a;
}

/// The exit status of an answer that is an error: 2 (misuse) when the
/// endpoint refused the command as malformed — 400, 404, 422: a value, an
/// actor or a path the user typed wrong, as the shell's own checks would —
/// else 1 (no answer, a refused token, an action the run cannot take now,
/// the run's own failure: 5xx).
int failed(const answer& a) {
  return a.status == 400 || a.status == 404 || a.status == 422 ? 2 : 1;
}

/// Why `target` (not a folder) is not HOST:PORT, when it looks like one (a
/// colon and digits after it); "" otherwise.  parse_connect says only no.
std::string bad_host_port(const std::string& target) {
  const auto colon = target.rfind(':');
  if (colon == std::string::npos)
    return "";
  const auto port = target.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    return "";
  if (port.size() > 5 || std::stoul(port) > 65535 || std::stoul(port) == 0)
    return target + ": port " + port + " is out of range (1..65535)";
  return target + " is neither a run folder nor HOST:PORT: '" + target.substr(0, colon)
         + "' is not a host name or IPv4 address (e.g. 127.0.0.1:40123, [::1]:40123, gpu-3.example:40123)";
}

/// What waiting cannot mend (--follow leaves on it): a token file that
/// cannot be read, HOST:PORT without a token or with a bad port.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The endpoint from a run folder's control.json or HOST:PORT plus a token.
endpoint find_endpoint(const std::string& target, const std::string& token_file, const std::string& ca) {
  endpoint ep;
  ep.ca = ca;
  if (!ca.empty() && (!std::filesystem::is_regular_file(ca) || ::access(ca.c_str(), R_OK) != 0))
    throw usage_error("--ca " + ca + ": cannot read it (a PEM file of the CA that signed the endpoint's certificate)");
  std::string token;
  if (!token_file.empty()) {
    std::ifstream f(token_file);
    if (!f)
      throw usage_error("--token-file " + token_file + ": cannot read it");
    std::getline(f, token);
    ep.token_from = "--token-file " + token_file;
  } else if (const char* t = std::getenv("TANDEM_TOKEN"); t != nullptr && *t != '\0') {
    token = t;
    ep.token_from = "TANDEM_TOKEN";
  }
  std::error_code is_dir_ec;
  const bool folder = std::filesystem::is_directory(target, is_dir_ec);
  if (auto a = folder ? std::nullopt : parse_connect(target)) {
    if (a->port == 0)  // control.listen's "any free port", never one to connect to
      throw usage_error(target + ": port 0 is out of range (1..65535)");
    ep.host = a->host;
    ep.port = std::to_string(a->port);
    ep.where = target;
    ep.tls = !ca.empty();
    if (token.empty())
      throw usage_error("HOST:PORT needs the run's token: --token-file FILE or TANDEM_TOKEN (it is in "
                        "RUN_DIR/control.json)");
    ep.token = token;
    return ep;
  }
  if (const auto why = folder ? std::string() : bad_host_port(target); !why.empty())
    throw usage_error(why);
  const auto file = std::filesystem::path(target) / "control.json";
  std::ifstream f(file);
  if (!f)
    throw std::runtime_error(file.string() + ": no such file: " + target
                             + " is not a running run's folder (a run writes control.json when its control "
                               "endpoint starts and removes it when it ends; [control] listen = \"\" has none)");
  auto j = json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("host") || !j.contains("port") || !j.contains("token"))
    throw std::runtime_error(file.string() + ": not a control file (host, port, token)");
  ep.host = j["host"].get<std::string>();
  ep.port = std::to_string(j["port"].get<int>());
  // A run on this host (a loopback address) whose process is gone was killed
  // before it could remove the file: nothing answers there.
  const bool here = ep.host == "localhost" || ep.host == "::1" || ep.host.rfind("127.", 0) == 0;
  const auto pid = j.value("pid", int64_t{-1});
  if (here && pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
    throw std::runtime_error(target + " is not running: its control.json names process " + std::to_string(pid)
                             + ", which is gone (killed before it could remove the file); `tandem run --resume` "
                               "continues the run");
  ep.token = token.empty() ? j["token"].get<std::string>() : token;
  if (token.empty())
    ep.token_from = file.string();
  ep.where = target;
  ep.tls = j.value("tls", false);
  return ep;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string pad(std::string s, size_t n) {
  if (s.size() < n)
    s.append(n - s.size(), ' ');
  return s;
}

std::string num(const json& j, const char* key, int digits = -1) {
  if (!j.contains(key) || j[key].is_null())
    return "-";
  const auto& v = j[key];
  if (v.is_number_float() && digits >= 0)
    return fixed(v.get<double>(), digits);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string gib(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? fixed(j[key].get<double>() / (1u << 30), 2) : "-";
}

/// The per-GPU memory lines of a tree answer.
void print_devices(const json& t) {
  if (!t.contains("devices") || t["devices"].empty())
    return;
  std::printf("\n%s %s %s %s %s\n", pad("GPU", 8).c_str(), pad("ALLOC-GiB", 10).c_str(), pad("RESERVED", 10).c_str(),
              pad("PEAK", 10).c_str(), "FROM");
  for (const auto& d : t["devices"])
    std::printf("%s %s %s %s %s at step %s\n", pad(d.value("device", ""), 8).c_str(),
                pad(gib(d, "allocated_bytes"), 10).c_str(), pad(gib(d, "reserved_bytes"), 10).c_str(),
                pad(gib(d, "peak_bytes"), 10).c_str(), d.value("reported_by", "").c_str(), num(d, "at_step").c_str());
}

/// What a tree entry says of its role: the coordinator's view of a
/// drafter, a target's forward times, a prefetch's cursor and throughput.
std::string role_detail(const json& a) {
  const auto f = a.value("figures", json::object());
  if (a["role"] == "drafter")
    return "incarnation " + num(a, "incarnation") + ", " + num(a, "steps_handled") + " steps, last "
           + num(a, "last_step") + ", failures " + num(a, "failures");
  if (a["role"] == "coordinator")
    return "step " + num(a, "step");
  if (a["role"] == "control")
    return num(a, "requests") + " requests";
  if (a["role"] == "target" && !f.empty())
    return num(f, "batches", 0) + " batches, forward " + num(f, "forward_ms_last", 1) + " ms (mean "
           + num(f, "forward_ms_mean", 1) + "), queue " + num(f, "queue_depth", 0);
  if (a["role"] == "prefetch" && !f.empty())
    return "epoch " + num(f, "epoch", 0) + ": " + num(f, "epoch_sent", 0) + "/" + num(f, "epoch_samples", 0)
           + " samples, " + num(f, "tokens_per_s", 0) + " tok/s, padding "
           + (f.contains("padding_waste") ? fixed(100 * f["padding_waste"].get<double>(), 1) : "-") + "%";
  return "";
}

void print_tree(const json& t) {
  std::printf("%s  (up %s s)\n", t.value("run", "").c_str(), fixed(t.value("uptime_s", 0.0), 0).c_str());
  std::printf("%s %s %s %s %s %s %s %s\n", pad("ACTOR", 14).c_str(), pad("DEVICE", 8).c_str(),
              pad("STATE", 13).c_str(), pad("THREAD", 12).c_str(), pad("UP-S", 7).c_str(), pad("MSGS", 8).c_str(),
              pad("LAST-MESSAGE", 22).c_str(), "DETAIL");
  for (const auto& a : t["actors"]) {
    // The thread: a detached actor's own, else the scheduler's pool (the
    // worker that ran its last message).
    std::string thread = "-";
    if (a.contains("thread"))
      thread = (a.value("own_thread", false) ? "" : "pool:") + num(a, "thread");
    auto detail = role_detail(a);
    if (a.contains("vitals"))
      detail += (detail.empty() ? "" : "; ") + a["vitals"].get<std::string>();
    // In a cluster: NODE:DEVICE (the member holding it).
    const auto where = a.contains("node") ? a.value("node", "") + ":" + a.value("device", "") : a.value("device", "");
    std::printf("%s %s %s %s %s %s %s %s\n", pad(a.value("name", ""), 14).c_str(),
                pad(where, 8).c_str(), pad(a.value("state", ""), 13).c_str(),
                pad(thread, 12).c_str(), pad(num(a, "uptime_s", 0), 7).c_str(), pad(num(a, "messages_handled"), 8).c_str(),
                pad(num(a, "last_message"), 22).c_str(), detail.c_str());
  }
  print_devices(t);
}

/// The durable step and its checkpoint, or that there is none yet (−1).
std::string durable(const json& j) {
  const auto step = j.value("durable_step", json());
  if (!step.is_number() || step.get<int64_t>() < 0)
    return "none yet (no checkpoint written)";
  const auto ckpt = j.value("checkpoint", std::string());
  return num(j, "durable_step") + (ckpt.empty() ? "" : " (" + ckpt + ")");
}

void print_status(const json& s) {
  const auto& c = s["coordinator"];
  std::printf("run %s: step %s, epoch %s%s%s; up %s s; %s requests, %s unauthorized\n", s.value("run", "").c_str(),
              num(c, "step").c_str(), num(c, "epoch").c_str(), c.value("paused", false) ? ", PAUSED" : "",
              c.value("stopping", false) ? ", stopping" : "", fixed(s.value("uptime_s", 0.0), 0).c_str(),
              num(s, "requests").c_str(), num(s, "unauthorized").c_str());
  if (c.contains("ledger"))
    std::printf("ledger: %s\n", c["ledger"].dump().c_str());
  std::printf("in flight %s, queued %s, busy %s; durable step %s\n", num(c, "in_flight").c_str(),
              num(c, "queued").c_str(), num(c, "busy").c_str(), durable(c).c_str());
  // What `set` changes: the next step's multiplier and its schedule, the
  // metrics line interval.
  std::string changes;
  for (const auto& x : c.value("lr_changes", json::array()))
    changes += (changes.empty() ? " (" : ", ") + num(x, "scale") + " from step " + num(x, "from_step");
  std::printf("lr-scale %s for the next step%s; log-every %s\n", num(c, "lr_scale").c_str(),
              (changes + (changes.empty() ? "" : ")")).c_str(), num(c, "log_every").c_str());
}

void print_ledger(const json& l) {
  std::printf("epoch %s, step %s\n", num(l, "epoch").c_str(), num(l, "step").c_str());
  if (l.contains("samples"))
    for (const char* k : {"pending", "issued", "trained", "committed"})
      std::printf("  %s %s\n", pad(k, 10).c_str(), num(l["samples"], k).c_str());
  std::printf("in flight %s, queued %s, credits per prefetch %s\n", num(l, "in_flight").c_str(),
              num(l, "queued").c_str(), num(l, "credits_per_prefetch").c_str());
  std::printf("durable step %s\n", durable(l).c_str());
  for (const auto& p : l.value("prefetch", json::array()))
    std::printf("prefetch %s: epoch %s, %s of %s samples sent, %s re-issued, %s credits\n", num(p, "index").c_str(),
                num(p, "epoch").c_str(), num(p, "epoch_sent").c_str(), num(p, "epoch_samples").c_str(),
                num(p, "reissued").c_str(), num(p, "credit").c_str());
}

void print_steps(const json& s) {
  std::printf("%s %s %s %s %s %s %s\n", pad("STEP", 8).c_str(), pad("DRAFTER", 8).c_str(), pad("LOSS", 9).c_str(),
              pad("ACC", 7).c_str(), pad("SIM-TAU", 8).c_str(), pad("LR", 10).c_str(), "STEP-MS");
  for (const auto& r : s["steps"])
    std::printf("%s %s %s %s %s %s %s\n", pad(num(r, "step"), 8).c_str(), pad(num(r, "drafter"), 8).c_str(),
                pad(num(r, "loss", 4), 9).c_str(), pad(num(r, "accuracy", 3), 7).c_str(),
                pad(num(r, "sim_accept", 2), 8).c_str(), pad(num(r, "lr", 6), 10).c_str(),
                num(r, "compute_ms", 1).c_str());
}

void print_events(const json& e) {
  for (const auto& line : e["events"]) {
    auto rest = line;
    rest.erase("seq");
    rest.erase("event");
    rest.erase("uptime_s");
    rest.erase("time_s");
    rest.erase("run");
    std::printf("#%s %s %s\n", num(line, "seq").c_str(), line.value("event", "?").c_str(), rest.dump().c_str());
  }
}

const char* help_text =
  "commands:\n"
  "  status               the run: step, epoch, paused, ledger, queues, lr-scale, log-every\n"
  "  tree                 every actor: device, state, thread, uptime, messages handled, the last\n"
  "                       one, and its role's figures (a target's forward times, a prefetch's cursor)\n"
  "  show ROLE [INDEX]    one actor in detail (show drafter 0)\n"
  "  top                  a full-screen view refreshed every second (q leaves)\n"
  "  ledger               samples pending / issued / trained / committed; each prefetch's cursor\n"
  "  steps [N]            the last N step reports (default 20)\n"
  "  events [-f] [--since SEQ]\n"
  "                       the event log (-f: follow it; q or Ctrl-C leaves; --since SEQ: only\n"
  "                       the events after number SEQ, as --json's \"seq\" or the #N printed)\n"
  "  config               the effective config (with what set changed since the start)\n"
  "  pause | resume       stop / restart sending work to the drafters\n"
  "  checkpoint           write a checkpoint now\n"
  "  stop                 as SIGTERM: finish the step, checkpoint, end the run\n"
  "  watch METRIC         a live sparkline of a step field (loss, accuracy, sim_accept, grad_norm,\n"
  "                       lr, compute_ms, wait_ms, tokens) over the last 60 reports (q leaves)\n"
  "  fault drafter N KIND [at STEP]\n"
  "                       inject a fault (throw, nan, cuda_error, cuda_sticky, hang, abort,\n"
  "                       slow_snapshot, throw_in_snapshot) at STEP, default its next step\n"
  "  set lr-scale X [at STEP]\n"
  "                       the learning rate times X from STEP on (default: the next step sent;\n"
  "                       kept in checkpoints)\n"
  "  set log-every N      a metrics.jsonl step line every N steps\n"
  "  dashboard            the web dashboard's address, with the token to open it once\n"
  "  graphs               each drafter's captured graphs and their memory pools; GPU memory\n"
  "  help, quit\n";

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string x; in >> x;)
    w.push_back(x);
  return w;
}

/// Reads one key within `ms` (raw mode set by the caller); 0 when none.
char key_within(int ms) {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, ms) > 0) {
    char c = 0;
    if (::read(STDIN_FILENO, &c, 1) == 1)
      return c;
  }
  return 0;
}

/// A command that repeats every second until a key leaves it: on a
/// terminal (`tty`) stdin in raw mode while it lives (no ISIG either, so
/// Ctrl-C arrives as a key and leaves the command, not the shell).
class repeating {
public:
  explicit repeating(bool tty) : tty_(tty) {
    if (!tty_)
      return;
    ::tcgetattr(STDIN_FILENO, &saved_);
    termios raw = saved_;
    raw.c_lflag &= static_cast<tcflag_t>(~(ICANON | ECHO | ISIG));
    ::tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  }
  ~repeating() {
    if (tty_)
      ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  repeating(const repeating&) = delete;
  repeating& operator=(const repeating&) = delete;
  bool tty() const { return tty_; }
  /// Waits a second; true when q or Ctrl-C was pressed meanwhile.
  bool wait_for_leave() const {
    const char k = tty_ ? key_within(1000) : (std::this_thread::sleep_for(std::chrono::seconds(1)), 0);
    return k == 'q' || k == 'Q' || k == 3;
  }

private:
  bool tty_;
  termios saved_{};
};

/// A full-screen view: `frame(tty)` prints one screen (0, or the exit
/// status that ends the view); once, or every second on a terminal (raw
/// mode: a key leaves without Enter) until `q` or Ctrl-C.
int refreshed(bool once, const std::function<int(bool tty)>& frame) {
  const repeating view(::isatty(STDIN_FILENO) != 0 && !once);
  for (;;) {
    const int rc = frame(view.tty());
    std::fflush(stdout);
    if (rc != 0 || once || view.wait_for_leave())
      return rc;
  }
}

/// `top`: the tree and the last reports, refreshed every second until `q`
/// (`as_json`: one JSON object a refresh, the same figures).
int top(const endpoint& ep, bool once, bool as_json) {
  return refreshed(once, [&](bool tty) {
    auto tree = call(ep, http::verb::get, "/v1/tree");
    auto status = call(ep, http::verb::get, "/v1/status");
    auto steps = call(ep, http::verb::get, "/v1/steps?n=200");
    if (!tree.error.empty() || !status.error.empty()) {
      std::fprintf(stderr, "%s\n", (tree.error.empty() ? status.error : tree.error).c_str());
      return failed(tree.error.empty() ? status : tree);
    }
    const auto& c = status.body["coordinator"];
    json view{{"run", status.body.value("run", "")}, {"step", c.value("step", json())}, {"epoch", c.value("epoch", json())},
              {"paused", c.value("paused", false)}, {"stopping", c.value("stopping", false)}, {"actors", json::array()}};
    for (const auto& a : tree.body["actors"]) {
      json row{{"name", a.value("name", "")}, {"device", a.value("device", "")}, {"state", a.value("state", "")}};
      if (a["role"] == "drafter") {
        // From this drafter's reports among the last 200.
        double busy = 0, idle = 0, n = 0;
        json last;
        std::vector<double> gaps;  // seconds between its reports' arrivals
        for (const auto& r : steps.body["steps"])
          if (r["drafter"] == a["index"]) {
            busy += r.value("compute_ms", 0.0);
            idle += r.value("wait_ms", 0.0);
            n += 1;
            if (!last.is_null())
              gaps.push_back(last.value("age_s", 0.0) - r.value("age_s", 0.0));
            last = r;
          }
        if (n > 0) {
          // The rate while it stepped; 0 once its last report is older than
          // five of its usual gaps between reports and 2 s (paused,
          // evaluating, stuck, ended).
          double gap = (busy + idle) / n / 1000.0;
          if (!gaps.empty()) {
            std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
            gap = gaps[gaps.size() / 2];
          }
          const double age = last.value("age_s", 0.0);
          const bool stalled = age > std::max(2.0, 5 * gap);
          row["steps_per_s"] = stalled ? 0.0 : 1000.0 * n / std::max(1e-9, busy + idle);
          row["last_report_s"] = age;
          for (const char* f : {"loss", "accuracy", "sim_accept"})
            row[f] = last.value(f, json());
          row["wait_pct"] = 100.0 * idle / std::max(1e-9, busy + idle);
          row["step_ms"] = busy / n;
        }
      }
      // The device's allocator (shared by the actors on it): allocated / reserved.
      for (const auto& d : tree.body.value("devices", json::array()))
        if (d.value("device", "") == a.value("device", "")) {
          row["allocated_bytes"] = d.value("allocated_bytes", json());
          row["reserved_bytes"] = d.value("reserved_bytes", json());
          row["mem"] = gib(d, "allocated_bytes") + "/" + gib(d, "reserved_bytes");
        }
      view["actors"].push_back(row);
    }
    if (as_json) {
      for (auto& row : view["actors"])
        row.erase("mem");
      std::printf("%s\n", view.dump().c_str());
      return 0;
    }
    std::string out = tty ? "\x1b[H\x1b[2J" : "";
    out += "tandem top - " + view.value("run", "") + "  step " + num(c, "step") + "  epoch " + num(c, "epoch")
           + (view["paused"].get<bool>() ? "  PAUSED" : "") + (view["stopping"].get<bool>() ? "  stopping" : "")
           + "   (q leaves)\n\n";
    out += pad("ACTOR", 16) + pad("DEVICE", 8) + pad("STATE", 13) + pad("STEPS/S", 9) + pad("LOSS", 9) + pad("ACC", 7)
           + pad("SIM-TAU", 9) + pad("WAIT%", 7) + pad("STEP-MS", 9) + "GPU-GiB\n";
    for (const auto& row : view["actors"]) {
      auto cell = [&](const char* f, int digits) {
        return row.contains(f) && row[f].is_number() ? fixed(row[f].get<double>(), digits) : std::string("-");
      };
      out += pad(row.value("name", ""), 16) + pad(row.value("device", ""), 8) + pad(row.value("state", ""), 13)
             + pad(cell("steps_per_s", 2), 9) + pad(cell("loss", 4), 9) + pad(cell("accuracy", 3), 7)
             + pad(cell("sim_accept", 2), 9) + pad(cell("wait_pct", 1), 7) + pad(cell("step_ms", 1), 9)
             + row.value("mem", "-") + "\n";
    }
    std::fputs(out.c_str(), stdout);
    return 0;
  });
}

/// `watch METRIC`: a sparkline of one step field over the last 60 reports
/// (per drafter), refreshed every second until `q` (`as_json`: one JSON
/// object a refresh, {"field", "drafters": {"N": [[step, value], ...]}}).
int watch(const endpoint& ep, const std::string& field, bool once, bool as_json) {
  static const std::vector<std::string> fields{"loss",       "accuracy", "sim_accept", "grad_norm",
                                               "lr",         "compute_ms", "wait_ms",  "tokens"};
  if (std::find(fields.begin(), fields.end(), field) == fields.end()) {
    std::string all;
    for (const auto& f : fields)
      all += (all.empty() ? "" : ", ") + f;
    std::fprintf(stderr, "watch METRIC: one of %s\n", all.c_str());
    return 2;
  }
  static const char* bars[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
  return refreshed(once, [&](bool tty) {
    auto steps = call(ep, http::verb::get, "/v1/steps?n=1000");
    if (!steps.error.empty()) {
      std::fprintf(stderr, "%s\n", steps.error.c_str());
      return failed(steps);
    }
    std::map<int64_t, std::vector<std::pair<int64_t, double>>> by_drafter;
    for (const auto& r : steps.body["steps"])
      if (r.contains(field) && r[field].is_number())
        by_drafter[r.value("drafter", int64_t{0})].emplace_back(r.value("step", int64_t{0}), r[field].get<double>());
    if (as_json) {
      json view{{"field", field}, {"drafters", json::object()}};
      for (auto& [d, xs] : by_drafter) {
        if (xs.size() > 60)
          xs.erase(xs.begin(), xs.end() - 60);
        auto& series = view["drafters"][std::to_string(d)] = json::array();
        for (const auto& x : xs)
          series.push_back({x.first, std::isfinite(x.second) ? json(x.second) : json(nullptr)});
      }
      std::printf("%s\n", view.dump().c_str());
      return 0;
    }
    std::string out = tty ? "\x1b[H\x1b[2J" : "";
    out += "watch " + field + " (the last 60 step reports" + (tty ? "; q leaves)" : ")") + "\n";
    if (by_drafter.empty())
      out += "  no step reports yet\n";
    for (auto& [d, xs] : by_drafter) {
      if (xs.size() > 60)
        xs.erase(xs.begin(), xs.end() - 60);
      double lo = xs.front().second, hi = lo;
      for (const auto& x : xs) {
        lo = std::min(lo, x.second);
        hi = std::max(hi, x.second);
      }
      std::string line;
      for (const auto& x : xs) {
        const int k = hi > lo ? static_cast<int>(std::lround((x.second - lo) / (hi - lo) * 7)) : 0;
        line += std::isfinite(x.second) ? bars[std::clamp(k, 0, 7)] : "!";
      }
      char tail[160];
      std::snprintf(tail, sizeof tail, "  steps %lld-%lld  min %.6g  max %.6g  last %.6g",
                    static_cast<long long>(xs.front().first), static_cast<long long>(xs.back().first), lo, hi,
                    xs.back().second);
      out += "drafter " + std::to_string(d) + "  " + line + "\n" + tail + "\n";
    }
    std::fputs(out.c_str(), stdout);
    return 0;
  });
}

/// An action with a JSON body; prints its result.
int act(const endpoint& ep, const std::string& path, const json& body, bool as_json) {
  auto a = call(ep, http::verb::post, path, body.dump());
  if (!a.error.empty()) {
    std::fprintf(stderr, "%s: %s\n", path.substr(4).c_str(), a.error.c_str());
    return failed(a);
  }
  if (as_json)
    std::printf("%s\n", a.body.dump().c_str());
  else
    std::printf("%s\n", a.body.value("result", "").c_str());
  return 0;
}

/// "at STEP" at w[i], w[i+1] (optional); false when malformed.
bool at_step(const std::vector<std::string>& w, size_t i, json& body) {
  if (w.size() == i)
    return true;
  if (w.size() != i + 2 || w[i] != "at" || w[i + 1].empty()
      || w[i + 1].find_first_not_of("0123456789") != std::string::npos || w[i + 1].size() > 15)
    return false;
  body["at_step"] = std::stoll(w[i + 1]);
  return true;
}

/// The words tab completion offers: the commands first, then (after a
/// command) the actors' roles and indices and the commands' arguments.
const std::vector<std::string> command_words{"status", "tree",  "show",  "top",        "ledger", "steps",
                                             "events", "config", "pause", "resume",     "checkpoint",
                                             "stop",   "watch", "fault", "set",         "dashboard", "graphs", "help", "quit"};

/// What a follower learns from the run folder once the endpoint is gone:
/// the events metrics.jsonl holds after `last` (the last one printed), and
/// whether the run ended (its last line an `end`) or not (a worker that
/// died: `tandem run` may be starting another).  HOST:PORT has no folder.
struct run_gone {
  json events = json::array();
  bool ended = false;
  std::string why;
};

run_gone run_end_from_folder(const endpoint& ep, const json& last) {
  run_gone g;
  std::error_code ec;
  if (!std::filesystem::is_directory(ep.where, ec)) {
    g.ended = true;
    g.why = "the run's endpoint is gone (the run ended, or its worker process is being restarted)";
    return g;
  }
  const auto file = std::filesystem::path(ep.where) / "metrics.jsonl";
  std::ifstream f(file, std::ios::binary);
  const auto size = f ? static_cast<int64_t>(std::filesystem::file_size(file, ec)) : 0;
  const int64_t from = std::max<int64_t>(0, size - (8 << 20));  // the last 8 MiB: the end's events
  f.seekg(from);
  std::vector<json> events;
  json last_line;
  std::string line;
  if (from > 0)
    std::getline(f, line);  // a partial first line
  while (std::getline(f, line)) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object())
      continue;
    last_line = j;
    if (j.contains("event") && j["event"] != "step")
      events.push_back(std::move(j));
  }
  // The last one printed: a line holding each of its fields (the endpoint's
  // copy has no `time_s` or `run`, metrics.jsonl's no `seq` or `uptime_s`).
  auto same = [&last](const json& e) {
    for (const auto& [k, v] : last.items())
      if (!e.contains(k) || e[k] != v)
        return false;
    return true;
  };
  size_t next = 0;
  if (!last.is_null())
    for (size_t i = events.size(); i > 0; --i)
      if (same(events[i - 1])) {
        next = i;
        break;
      }
  if (!last.is_null() && next == 0)
    next = events.size();  // the last one printed is not found: print nothing again
  for (size_t i = next; i < events.size(); ++i)
    g.events.push_back(events[i]);
  if (last_line.is_object() && last_line.value("event", "") == "end") {
    g.ended = true;
    g.why = "the run has ended (" + last_line.value("reason", std::string("?")) + ")";
  } else {
    g.why = "the run's endpoint is gone and its metrics.jsonl has no end: its worker process died (tandem run "
            "starts another within its supervision.worker_restarts; --follow waits for it)";
  }
  return g;
}

/// Runs one command line; returns its exit status (0 ok, 1 failed, 2 misuse:
/// the shell's checks or the endpoint's 400/404/422, failed()).
int run_command(const endpoint& ep, const std::string& line, bool as_json, bool interactive) {
  const auto w = words(line);
  if (w.empty())
    return 0;
  const auto& cmd = w[0];
  // Words past what a command takes are refused, not ignored ("pause now"
  // must not read as a pause with an option it does not have).
  static const std::map<std::string, std::pair<size_t, const char*>> takes{
    {"help", {0, "help"}}, {"?", {0, "help"}}, {"quit", {0, "quit"}}, {"exit", {0, "exit"}},
    {"status", {0, "status"}}, {"tree", {0, "tree"}}, {"ledger", {0, "ledger"}}, {"config", {0, "config"}},
    {"steps", {1, "steps [N]"}}, {"show", {2, "show ROLE [INDEX]"}}, {"events", {3, "events [-f] [--since SEQ]"}},
    {"top", {0, "top"}}, {"graphs", {0, "graphs"}}, {"dashboard", {0, "dashboard"}},
    {"pause", {0, "pause"}}, {"resume", {0, "resume"}}, {"checkpoint", {0, "checkpoint"}}, {"stop", {0, "stop"}}};
  if (auto t = takes.find(cmd); t != takes.end() && w.size() - 1 > t->second.first) {
    std::fprintf(stderr, "%s: '%s' is more than it takes (%s)\n", cmd.c_str(), w[t->second.first + 1].c_str(),
                 t->second.second);
    return 2;
  }
  if (cmd == "steps" && w.size() > 1 && (w[1].empty() || w[1].find_first_not_of("0123456789") != std::string::npos)) {
    std::fprintf(stderr, "steps [N]: N is a count of steps, got '%s'\n", w[1].c_str());
    return 2;
  }
  // events [-f] [--since SEQ], in either order.
  bool follow = false;
  int64_t since = 0;
  if (cmd == "events")
    for (size_t i = 1; i < w.size(); ++i) {
      if ((w[i] == "-f" || w[i] == "--follow") && !follow) {
        follow = true;
        continue;
      }
      if (w[i] == "--since" && i + 1 < w.size()) {
        const auto& v = w[++i];
        if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) {
          std::fprintf(stderr, "events [-f] [--since SEQ]: SEQ is an event's number (#N, \"seq\"), got '%s'\n",
                       v.c_str());
          return 2;
        }
        since = std::stoll(v);
        continue;
      }
      std::fprintf(stderr, "events [-f] [--since SEQ]: '%s' is not -f or --since SEQ%s\n", w[i].c_str(),
                   w[i] == "--since" ? " (SEQ is missing)" : "");
      return 2;
    }
  auto show = [&](const answer& a, void (*pretty)(const json&)) {
    if (!a.error.empty()) {
      std::fprintf(stderr, "%s\n", a.error.c_str());
      return failed(a);
    }
    if (as_json || !pretty)
      std::printf("%s\n", a.body.dump(as_json ? -1 : 2).c_str());
    else
      pretty(a.body);
    return 0;
  };
  if (cmd == "help" || cmd == "?") {
    if (as_json)
      std::printf("%s\n", json{{"commands", command_words}, {"text", help_text}}.dump().c_str());
    else
      std::fputs(help_text, stdout);
    return 0;
  }
  if (cmd == "quit" || cmd == "exit")
    return 0;  // -c quit: nothing more to do (the interactive loop leaves before this)
  if (cmd == "status")
    return show(call(ep, http::verb::get, "/v1/status"), print_status);
  if (cmd == "tree")
    return show(call(ep, http::verb::get, "/v1/tree"), print_tree);
  if (cmd == "ledger")
    return show(call(ep, http::verb::get, "/v1/ledger"), print_ledger);
  if (cmd == "config") {
    auto a = call(ep, http::verb::get, "/v1/config");
    if (a.error.empty() && !as_json) {
      std::fputs(a.body.value("toml", "").c_str(), stdout);
      if (a.body.contains("note"))
        std::fprintf(stderr, "%s\n", a.body.value("note", "").c_str());
      return 0;
    }
    return show(a, nullptr);
  }
  if (cmd == "steps") {
    const std::string n = w.size() > 1 ? w[1] : "20";
    return show(call(ep, http::verb::get, "/v1/steps?n=" + n), print_steps);
  }
  if (cmd == "show") {
    if (w.size() < 2) {
      std::fprintf(stderr, "show ROLE [INDEX] (e.g. show drafter 0)\n");
      return 2;
    }
    // "drafter1" or "drafter 1"
    std::string role = w[1], index = w.size() > 2 ? w[2] : "";
    while (!role.empty() && std::isdigit(static_cast<unsigned char>(role.back())) && index.empty()) {
      const auto at = role.find_first_of("0123456789");
      index = role.substr(at);
      role = role.substr(0, at);
    }
    // A role and an index the run lacks (drafter 7, drafter -1) are the
    // endpoint's to name, with what it has (404); words that cannot be
    // either are refused here.
    static const std::regex role_word("[a-z_]+"), whole_number("-?[0-9]+");
    std::string why;
    if (!std::regex_match(role, role_word))
      why = "ROLE is a word such as drafter or target, got '" + role + "'";
    else if (!index.empty() && !std::regex_match(index, whole_number))
      why = "INDEX is a whole number, got '" + index + "'";
    if (!why.empty()) {
      std::fprintf(stderr, "show ROLE [INDEX]: %s (e.g. show drafter 0; tree lists the actors)\n", why.c_str());
      return 2;
    }
    return show(call(ep, http::verb::get, "/v1/actors/" + role + "/" + (index.empty() ? "0" : index)), nullptr);
  }
  if (cmd == "events") {
    json last;  // the last event printed, as metrics.jsonl holds it
    auto print = [&](const json& events) {
      if (as_json)
        for (const auto& e : events)
          std::printf("%s\n", e.dump().c_str());
      else
        print_events(json{{"events", events}});
      if (!events.empty()) {
        last = events.back();
        last.erase("seq");
        last.erase("uptime_s");
      }
      std::fflush(stdout);
    };
    // Interactive on a terminal: q or Ctrl-C leaves the command, not the shell.
    const repeating follower(follow && interactive && ::isatty(STDIN_FILENO) != 0);
    int rc = 0;
    bool polled = false;
    for (;;) {
      // The first poll after --since SEQ asks from SEQ itself: event SEQ, not
      // printed, is where the run folder's lines go on should the endpoint go.
      const auto from = !polled && since > 0 ? since - 1 : since;
      auto a = call(ep, http::verb::get, "/v1/events?since=" + std::to_string(from));
      if (!a.error.empty()) {
        if (polled && a.status == 0) {
          // The endpoint went: what the run wrote after the last poll (its
          // last events, the end) is in the run folder's metrics.jsonl.
          const auto gone = run_end_from_folder(ep, last);
          print(gone.events);
          std::fprintf(stderr, "%s\n", gone.why.c_str());
          rc = gone.ended ? 0 : 1;
          break;
        }
        std::fprintf(stderr, "%s\n", a.error.c_str());
        rc = failed(a);
        break;
      }
      auto events = a.body["events"];
      if (!polled && since > 0 && !events.empty() && events[0].value("seq", int64_t{0}) == since) {
        last = events[0];
        last.erase("seq");
        last.erase("uptime_s");
        events.erase(events.begin());
      }
      print(events);
      polled = true;
      since = std::max(since, a.body.value("next", since));  // --since past the last: wait for it
      if (!follow || follower.wait_for_leave())
        break;
    }
    return rc;
  }
  if (cmd == "top")
    return top(ep, !interactive, as_json);
  if (cmd == "graphs") {
    // Every drafter's captured graphs and their pools, then the devices.
    auto tree = call(ep, http::verb::get, "/v1/tree");
    if (!tree.error.empty()) {
      std::fprintf(stderr, "%s\n", tree.error.c_str());
      return failed(tree);
    }
    json all = json::array();
    for (const auto& a : tree.body["actors"]) {
      if (a.value("role", "") != "drafter")
        continue;
      auto d = call(ep, http::verb::get, "/v1/actors/drafter/" + num(a, "index"));
      if (!d.error.empty()) {
        std::fprintf(stderr, "%s\n", d.error.c_str());
        return failed(d);
      }
      all.push_back({{"drafter", a["index"]}, {"device", a["device"]},
                     {"captured_graphs", d.body.value("captured_graphs", json::array())},
                     {"memory", d.body.value("memory", json::object())}});
    }
    if (as_json) {
      std::printf("%s\n", json{{"drafters", all}, {"devices", tree.body.value("devices", json::array())}}.dump().c_str());
      return 0;
    }
    for (const auto& d : all) {
      std::printf("drafter %s (%s): ", num(d, "drafter").c_str(), d.value("device", "").c_str());
      if (d["captured_graphs"].empty())
        std::printf("no captured graph (eager: the CPU, or not captured yet)\n");
      for (const auto& g : d["captured_graphs"])
        std::printf("graph '%s', private pool %s MiB\n", g.value("graph", "").c_str(),
                    fixed(g.value("pool_bytes", 0.0) / (1 << 20), 1).c_str());
    }
    print_devices(tree.body);
    return 0;
  }
  if (cmd == "dashboard") {
    // The address to open once: the endpoint answers with a cookie and
    // drops the token from the URL.
    const auto host = ep.host.find(':') != std::string::npos ? "[" + ep.host + "]" : ep.host;
    const auto url = std::string(ep.tls ? "https" : "http") + "://" + host + ":" + ep.port + "/?token=" + ep.token;
    if (as_json)
      std::printf("%s\n", json{{"url", url}}.dump().c_str());
    else
      std::printf("%s\n", url.c_str());
    return 0;
  }
  if (cmd == "watch") {
    if (w.size() != 2) {
      std::fprintf(stderr, "watch METRIC (e.g. watch loss)\n");
      return 2;
    }
    return watch(ep, w[1], !interactive, as_json);
  }
  if (cmd == "fault") {
    // fault drafter N KIND [at STEP]
    json body;
    if (w.size() < 4 || w[1] != "drafter" || w[2].empty() || w[2].find_first_not_of("0123456789") != std::string::npos
        || w[2].size() > 6 || !at_step(w, 4, body)) {
      std::fprintf(stderr, "fault drafter N KIND [at STEP] (e.g. fault drafter 0 throw at 120)\n");
      return 2;
    }
    body["drafter"] = std::stoi(w[2]);
    body["kind"] = w[3];
    return act(ep, "/v1/fault", body, as_json);
  }
  if (cmd == "set") {
    // set lr-scale X [at STEP] | set log-every N: decimal numbers only (no
    // hex, inf or nan, which strtod would take).
    json body;
    const std::string x = w.size() >= 3 ? w[2] : "";
    static const std::regex decimal(R"([+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)");
    const bool number = std::regex_match(x, decimal) && std::isfinite(std::strtod(x.c_str(), nullptr));
    if (w.size() >= 3 && w[1] == "lr-scale") {
      if (!number) {
        std::fprintf(stderr, "set lr-scale X: X is a positive decimal number up to 1e6 (1, 0.5, 2e-1), got '%s'\n",
                     x.c_str());
        return 2;
      }
      if (!at_step(w, 3, body)) {
        std::fprintf(stderr, "set lr-scale X [at STEP]: STEP is a step number (at most 15 digits)\n");
        return 2;
      }
      body["value"] = std::strtod(x.c_str(), nullptr);
      return act(ep, "/v1/lr_scale", body, as_json);
    }
    if (w.size() == 3 && w[1] == "log-every") {
      if (x.empty() || x.size() > 9 || x.find_first_not_of("0123456789") != std::string::npos) {
        std::fprintf(stderr, "set log-every N: N is a whole number of steps, got '%s'\n", x.c_str());
        return 2;
      }
      body["value"] = std::stoll(x);
      return act(ep, "/v1/log_every", body, as_json);
    }
    std::fprintf(stderr, "set lr-scale X [at STEP] | set log-every N\n");
    return 2;
  }
  for (const char* action : {"pause", "resume", "checkpoint", "stop"})
    if (cmd == action) {
      auto a = call(ep, http::verb::post, std::string("/v1/") + action, "{}");
      if (!a.error.empty()) {
        std::fprintf(stderr, "%s: %s\n", action, a.error.c_str());
        return failed(a);
      }
      if (as_json)
        std::printf("%s\n", a.body.dump().c_str());
      else
        std::printf("%s\n", a.body.value("result", "").c_str());
      return 0;
    }
  std::fprintf(stderr, "unknown command '%s' (help lists them)\n", cmd.c_str());
  return 2;
}



#ifdef TANDEM_HAVE_LIBEDIT
// libedit's completion hooks are C callbacks without a user pointer: the
// candidates live here, set by the one interactive loop of the process.
std::vector<std::string> completion_args;
const std::vector<std::string>* completion_candidates = &command_words;

char* next_completion(const char* text, int state) {
  static size_t next = 0;
  if (state == 0)
    next = 0;
  const std::string prefix = text;
  while (next < completion_candidates->size()) {
    const auto& w = (*completion_candidates)[next++];
    if (w.compare(0, prefix.size(), prefix) == 0)
      return ::strdup(w.c_str());
  }
  return nullptr;
}

char** complete(const char* text, int start, int) {
  rl_attempted_completion_over = 1;  // no file names
  completion_candidates = start == 0 ? &command_words : &completion_args;
  return rl_completion_matches(text, next_completion);
}

/// Where the history is kept between uses: $TANDEM_SHELL_HISTORY, else
/// ~/.tandem_shell_history ("" when there is no home).
std::string history_file() {
  if (const char* f = std::getenv("TANDEM_SHELL_HISTORY"))
    return f;
  const char* home = std::getenv("HOME");
  return home != nullptr && *home != '\0' ? std::string(home) + "/.tandem_shell_history" : std::string();
}
#endif

/// One line from the terminal (line editing, history and completion with
/// libedit; plain std::getline without it or when stdin is not a terminal).
std::optional<std::string> read_line(const char* prompt) {
#ifdef TANDEM_HAVE_LIBEDIT
  if (::isatty(STDIN_FILENO) != 0) {
    char* raw = ::readline(prompt);
    if (raw == nullptr)
      return std::nullopt;
    std::string line = raw;
    ::free(raw);
    if (line.find_first_not_of(" \t") != std::string::npos) {
      ::add_history(line.c_str());
      if (const auto f = history_file(); !f.empty())
        ::write_history(f.c_str());
    }
    return line;
  }
#endif
  std::printf("%s", prompt);
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line))
    return std::nullopt;
  return line;
}

/// The interactive shell's set-up: history and completion of actor names.
void start_line_editing(const json& tree) {
#ifdef TANDEM_HAVE_LIBEDIT
  ::rl_attempted_completion_function = complete;
  ::stifle_history(1000);
  if (const auto f = history_file(); !f.empty())
    ::read_history(f.c_str());
  std::set<std::string> args{"-f",         "drafter",       "target",     "prefetch",    "coordinator",
                             "eval",       "lr-scale",      "log-every",  "at",          "loss",
                             "accuracy",   "sim_accept",    "grad_norm",  "lr",          "compute_ms",
                             "wait_ms",    "tokens",        "throw",      "nan",         "cuda_error",
                             "cuda_sticky", "hang",         "abort",      "slow_snapshot", "throw_in_snapshot"};
  if (tree.contains("actors"))
    for (const auto& a : tree["actors"]) {
      args.insert(a.value("role", ""));
      args.insert(std::to_string(a.value("index", 0)));
    }
  completion_args.assign(args.begin(), args.end());
#else
  (void)tree;
#endif
}

} // namespace

void add_shell(CLI::App& app, int& exit_code) {
  struct options {
    std::string target;
    std::string token_file;
    std::string ca;
    std::vector<std::string> commands;
    bool json = false;
    bool follow = false;
  };
  auto o = std::make_shared<options>();
  auto* cmd = app.add_subcommand("shell", "Inspect and steer a running `tandem run` through its control endpoint "
                                          "(status, tree, show, top, ledger, graphs, steps, events, watch, config, dashboard, pause, "
                                          "resume, checkpoint, stop, fault, set; -c help lists them)");
  cmd->add_option("target", o->target,
                  "The run's folder (its control.json says where and holds the token), or HOST:PORT")
    ->required();
  cmd->add_option("--token-file", o->token_file,
                  "A file holding the token (else TANDEM_TOKEN, else the run folder's control.json)");
  cmd->add_option("--ca", o->ca, "Verify the endpoint's TLS certificate with this CA file (PEM); with "
                                 "HOST:PORT it also means the endpoint speaks TLS");
  cmd->add_option("-c,--command", o->commands, "Run this command and exit (repeatable; the exit status is the "
                                               "worst of them, below); without it the shell reads commands from "
                                               "the terminal");
  cmd->add_flag("--json", o->json, "Print the endpoint's JSON answers, one per line");
  cmd->add_flag("--follow", o->follow,
                "Interactive: when the run ends or its endpoint goes, wait for it to come back (a resumed run, a new "
                "worker process: its new control.json) and reconnect, instead of leaving; Ctrl-C leaves");
  cmd->footer("Exit status (with -c, the worst of the commands'):\n"
              "  0  every command did what it says\n"
              "  1  a command failed: the endpoint did not answer, refused the token (401), the run could not\n"
              "     do it now (409: a step already taken, a run that is stopping), or the run failed it (5xx)\n"
              "  2  misuse: a command unknown or malformed (the shell's checks, or the endpoint's 400, 404, 422:\n"
              "     a bad value, an actor or role the run lacks), a bad HOST:PORT, no token for it, no\n"
              "     control.json in the run folder, or one whose process is gone\n");
  // --follow: until the endpoint answers again (a run folder's control.json
  // is read afresh: a resumed run or a new worker listens elsewhere).
  auto wait_for_endpoint = [o](endpoint& ep) {
    std::printf("waiting for the run to come back (--follow; Ctrl-C leaves)\n");
    std::fflush(stdout);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      try {
        auto next = find_endpoint(o->target, o->token_file, o->ca);
        auto hello = call(next, http::verb::get, "/v1/status", "", std::chrono::milliseconds(3000));
        if (hello.error.empty()) {
          ep = next;
          std::printf("reconnected to run %s at %s:%s\n", hello.body.value("run", "").c_str(), ep.host.c_str(),
                      ep.port.c_str());
          return;
        }
      } catch (const usage_error&) {
        throw;  // the token file went away: waiting will not mend it
      } catch (const std::exception&) {
        // no control.json yet: keep waiting
      }
    }
  };
  cmd->callback([o, &exit_code, wait_for_endpoint] {
    endpoint ep;
    try {
      try {
        ep = find_endpoint(o->target, o->token_file, o->ca);
      } catch (const usage_error&) {
        throw;
      } catch (const std::exception&) {
        if (!o->follow)
          throw;
        wait_for_endpoint(ep);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem shell: %s\n", e.what());
      exit_code = 2;
      return;
    }
    if (!o->commands.empty()) {
      exit_code = 0;
      for (const auto& c : o->commands) {
        const auto w = words(c);
        if (!w.empty() && (w[0] == "quit" || w[0] == "exit"))
          break;
        exit_code = std::max(exit_code, run_command(ep, c, o->json, false));  // 2 (usage) over 1 (failed)
      }
      return;
    }
    // Interactive.
    auto hello = call(ep, http::verb::get, "/v1/status");
    if (!hello.error.empty()) {
      std::fprintf(stderr, "tandem shell: %s\n", hello.error.c_str());
      exit_code = 1;
      return;
    }
    std::printf("connected to run %s at %s:%s (help lists the commands)\n", hello.body.value("run", "").c_str(),
                ep.host.c_str(), ep.port.c_str());
    start_line_editing(call(ep, http::verb::get, "/v1/tree").body);
    for (;;) {
      const auto read = read_line("tandem> ");
      if (!read)
        break;
      const auto& line = *read;
      const auto w = words(line);
      if (!w.empty() && (w[0] == "quit" || w[0] == "exit"))
        break;
      run_command(ep, line, o->json, true);
      // The run may have ended meanwhile (an empty line asks too): say so and leave.
      {
        auto alive = call(ep, http::verb::get, "/v1", "", std::chrono::milliseconds(3000));
        if (alive.status == 0) {
          std::printf("the run has ended or its endpoint is gone (%s)\n", alive.error.c_str());
          if (!o->follow)
            break;
          try {
            wait_for_endpoint(ep);
          } catch (const usage_error& e) {
            std::fprintf(stderr, "tandem shell: %s\n", e.what());
            exit_code = 2;
            return;
          }
        }
      }
    }
    exit_code = 0;
  });
}

} // namespace tandem::cli
