// `tandem node --join HOST:PORT --name NAME`: a cluster member (issue 18,
// messages/node.hpp).  It connects to the leader's door (retrying with
// backoff until the leader is up), says hello in plain strings (build,
// versions, name, join token, devices), then hands the leader its node
// agent, which spawns the actors the run's plan places on this node.  It
// exits with the run's exit code when the leader says the run ended, and
// non-zero with a message when the leader is lost or refuses it.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#ifdef TANDEM_HAVE_CAF_OPENSSL
#include <caf/openssl/all.hpp>
#endif

#include "actors/cluster.hpp"
#include "actors/cluster_gate.hpp"
#include "build_info.hpp"
#include "commands.hpp"
#include "gpu/device/runtime.hpp"
#include "gpu/transport/link.hpp"
#include "gpu/transport/transport.hpp"
#include "launch/run_config.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

namespace tandem::cli {

std::vector<std::string> build_hello(const std::string& name, const std::string& token, int32_t gpus) {
  const auto rt = gpu::query_runtime();
  std::vector<std::string> h(hello_fields::count);
  h[hello_fields::protocol] = hello_fields::protocol_name;
  h[hello_fields::version] = build::version;
  h[hello_fields::commit] = build::git_commit;
  h[hello_fields::torch] = rt.torch_version;
  h[hello_fields::cuda] = rt.cuda_runtime > 0 ? std::to_string(rt.cuda_runtime / 1000) + "."
                                                  + std::to_string(rt.cuda_runtime % 1000 / 10)
                                              : "";
  h[hello_fields::nccl] = rt.nccl_version;
  h[hello_fields::name] = name;
  h[hello_fields::token] = token;
  h[hello_fields::devices] = gpus > 0 ? "cuda:" + std::to_string(gpus) : "cpu";
  h[hello_fields::pid] = std::to_string(::getpid());
  h[hello_fields::host] = gpu::transport::host_identity();
  // integration.cluster's refusal of another build: this process poses as one.
  if (const char* v = std::getenv("TANDEM_TEST_HELLO_VERSION"))
    h[hello_fields::version] = v;
  // ... and its refusal of a node on another host: posing as one.
  // The process's host is then that one for the transports too: a drafter
  // pulls over an NCCL link what a target on "another host" produced.
  if (const char* v = std::getenv("TANDEM_TEST_HELLO_HOST")) {
    h[hello_fields::host] = v;
    gpu::transport::set_host_identity(v);
  }
  return h;
}

void configure_cluster_system(caf::actor_system_config& cfg, double heartbeat_s, double timeout_s,
                              const std::string& certs) {
  register_messages(cfg);
  cfg.load<caf::io::middleman>();
  if (!certs.empty()) {
    const std::filesystem::path dir(certs);
    for (const char* f : {"cert.pem", "key.pem", "ca.pem"})
      if (!std::filesystem::is_regular_file(dir / f))
        throw std::runtime_error(certs + ": no " + f + " (give a node's folder of `tandem certs DIR --nodes ...`)");
#ifdef TANDEM_HAVE_CAF_OPENSSL
    cfg.load<caf::openssl::manager>();
    cfg.openssl_certificate = (dir / "cert.pem").string();
    cfg.openssl_key = (dir / "key.pem").string();
    cfg.openssl_cafile = (dir / "ca.pem").string();
#else
    throw std::runtime_error(certs + ": this build has no TLS between nodes (it was built without libcaf-openssl)");
#endif
  }
  auto span = [](double s) { return caf::timespan{static_cast<int64_t>(s * 1e9)}; };
  cfg.set("middleman.heartbeat-interval", span(heartbeat_s));
  cfg.set("middleman.connection-timeout", span(timeout_s));
  // A second guard under the hello: a peer that is not a Tandem node of
  // this wire protocol fails CAF's own handshake.  (The hello, which names
  // both builds, is the check that tells the user what differs.)
  cfg.set("middleman.app-identifiers", std::vector<std::string>{std::string(hello_fields::protocol_name)});
}

caf::expected<caf::actor> connect_to(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls) {
#ifdef TANDEM_HAVE_CAF_OPENSSL
  if (tls)
    return caf::openssl::remote_actor(sys, host, port);
#endif
  (void)tls;
  return sys.middleman().remote_actor(host, port);
}

caf::expected<uint16_t> publish_door(caf::actor_system& sys, const caf::actor& door, uint16_t port,
                                     const std::string& host, bool tls) {
#ifdef TANDEM_HAVE_CAF_OPENSSL
  if (tls)
    return caf::openssl::publish(door, port, host.c_str(), true);
#endif
  (void)tls;
  return sys.middleman().publish(door, port, host.c_str(), true);
}

namespace {

std::atomic<int> node_signal{0};
extern "C" void on_node_signal(int sig) { node_signal.store(sig); }

struct node_options {
  std::string join, name, devices, token_file, certs;
  double wait_s = 600, heartbeat_s = 2, timeout_s = 10;
};

std::string read_token(const std::string& file) {
  std::ifstream in(file);
  if (!in)
    throw std::runtime_error("--token-file " + file + ": cannot read it");
  std::string t;
  in >> t;
  if (t.size() != 64 || t.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error("--token-file " + file + ": not a join token (64 hex digits; `tandem certs` writes "
                             "NODE/join.token)");
  return t;
}

/// --devices: "cpu", or cuda:0,...,cuda:K-1 (K GPUs; others through
/// CUDA_VISIBLE_DEVICES); "" = every GPU of this host, else the CPU.
int32_t parse_devices(const std::string& text) {
  const auto host = static_cast<int32_t>(gpu::query_runtime().devices.size());
  if (text.empty())
    return host;
  if (text == "cpu")
    return 0;
  int32_t k = 0;
  std::stringstream in(text);
  for (std::string d; std::getline(in, d, ',');) {
    if (d != "cuda:" + std::to_string(k))
      throw std::runtime_error("--devices " + text + ": give \"cpu\" or cuda:0,cuda:1,... in order (a node's GPUs "
                               "are counted from 0; pick others with CUDA_VISIBLE_DEVICES)");
    ++k;
  }
  if (k > host)
    throw std::runtime_error("--devices " + text + ": this host has " + std::to_string(host) + " GPU(s)");
  return k;
}

/// Leaves at once, without CAF's teardown: its own shared-memory segments
/// go first.  For a node that never joined (nothing of a run is here to
/// save, and tearing down CAF with its OpenSSL layer mid-handshake after a
/// refused TLS handshake could abort the process after its message:
/// integration.cluster part 7 saw SIGABRT, exit 134, instead of 2), and for
/// one whose actors did not end within their grace.
[[noreturn]] void leave_now(int code) {
  gpu::transport::unlink_own_segments();
  std::fflush(nullptr);
  std::_Exit(code);
}

int run_node(const node_options& o) {
  report_crashes("tandem node");
  if (!valid_node_name(o.name)) {
    std::fprintf(stderr, "tandem node: --name '%s': lowercase letters, digits and '-' (not cpu, cuda or auto)\n",
                 o.name.c_str());
    return 2;
  }
  const auto addr = parse_connect(o.join);
  if (!addr || addr->port == 0) {
    std::fprintf(stderr, "tandem node: --join '%s': give the leader's HOST:PORT (tandem run --listen)\n",
                 o.join.c_str());
    return 2;
  }
  if (!addr->loopback() && o.certs.empty()) {
    std::fprintf(stderr, "tandem node: --join %s is not a loopback address: between hosts the nodes speak TLS only; "
                         "give --certs DIR/%s (tandem certs DIR --nodes ...)\n", o.join.c_str(), o.name.c_str());
    return 2;
  }
  std::string token;
  int32_t gpus = 0;
  try {
    if (!o.token_file.empty())
      token = read_token(o.token_file);
    gpus = parse_devices(o.devices);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem node: %s\n", e.what());
    return 2;
  }
  if (o.timeout_s <= o.heartbeat_s) {
    std::fprintf(stderr, "tandem node: --timeout-s must be more than --heartbeat-s\n");
    return 2;
  }
  gpu::transport::share_with_host(true);
  if (const auto n = gpu::transport::sweep_orphan_segments())
    std::fprintf(stderr, "tandem node: removed %zu shared-memory segment(s) of dead processes\n", n);

  caf::actor_system_config cfg;
  try {
    configure_cluster_system(cfg, o.heartbeat_s, o.timeout_s, o.certs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem node: --certs %s\n", e.what());
    return 2;
  }
  caf::actor_system sys{cfg};
  std::signal(SIGINT, on_node_signal);
  std::signal(SIGTERM, on_node_signal);
  std::signal(SIGHUP, on_node_signal);
  const auto hello = build_hello(o.name, token, gpus);
  gpu::transport::name_nccl_host(o.name, false);  // per process once the plan says cluster.transport = "nccl"
  // CAF connects to a local connector, which passes the leader's gate
  // (actors/cluster_gate.hpp) and then copies bytes.
  connector_options co;
  co.gate_host = addr->host == "localhost" ? "127.0.0.1" : addr->host;
  co.gate_port = addr->port;
  co.name = o.name;
  co.token_hex = token;
  gate_connector connector(co);

  // Join: retry with backoff until the leader is up (or --wait-s).
  const auto t0 = std::chrono::steady_clock::now();
  double backoff = 0.25;
  caf::actor door;
  std::vector<std::string> leader_hello;
  caf::scoped_actor self{sys};
  // Handshakes that failed after the gate let this node through: not a
  // leader still starting (its gate answers once it listens), but TLS
  // that cannot agree — said at once rather than retried for --wait-s.
  int past_gate = 0;
  for (int attempt = 1;; ++attempt) {
    if (node_signal.load())
      leave_now(128 + node_signal.load());
    const auto passed_before = connector.passed();
    auto d = connect_to(sys, "127.0.0.1", connector.port(), !o.certs.empty());
    std::string why;
    if (const auto no = connector.refusal(); !no.empty()) {
      std::fprintf(stderr, "tandem node: the leader at %s refused this node: %s\n", o.join.c_str(), no.c_str());
      leave_now(2);
    }
    if (d) {
      bool refused = false;
      self->request(*d, std::chrono::seconds(30), join_atom::value, hello)
        .receive([&](std::vector<std::string>& h) { leader_hello = std::move(h); },
                 [&](caf::error& e) {
                   why = sys.render(e);
                   refused = e.category() == error_category;
                 });
      if (refused) {
        std::fprintf(stderr, "tandem node: the leader at %s refused this node: %s\n", o.join.c_str(), why.c_str());
        leave_now(2);
      }
      if (why.empty()) {
        door = *d;
        break;
      }
    } else {
      why = sys.render(d.error());
      if (connector.passed() > passed_before) {
        if (++past_gate >= 3) {
          if (o.certs.empty())
            std::fprintf(stderr, "tandem node: the leader at %s let this node through its gate, but the handshake "
                                 "after it failed %d times (%s): the leader speaks TLS (cluster.certs); pass --certs "
                                 "with this node's folder of `tandem certs`\n",
                         o.join.c_str(), past_gate, why.c_str());
          else
            std::fprintf(stderr, "tandem node: the leader at %s let this node through its gate, but the TLS "
                                 "handshake failed %d times (%s): the leader's certificate is not signed by the CA "
                                 "in %s/ca.pem (another `tandem certs` run's?), this node's is not signed by the "
                                 "leader's CA, or the leader has no cluster.certs\n",
                         o.join.c_str(), past_gate, why.c_str(), o.certs.c_str());
          leave_now(2);
        }
      } else {
        past_gate = 0;
        if (const auto t = connector.trouble(); !t.empty())
          why = t;  // nothing listens there yet, most likely: CAF only saw its loopback connection close
      }
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > o.wait_s) {
      std::fprintf(stderr, "tandem node: no leader at %s after %.0f s (--wait-s): %s\n", o.join.c_str(), waited,
                   why.c_str());
      leave_now(1);
    }
    if (attempt == 1 || attempt % 10 == 0)
      std::fprintf(stderr, "tandem node '%s': waiting for the leader at %s (%s%s); retrying\n", o.name.c_str(),
                   o.join.c_str(), why.c_str(),
                   past_gate == 0  ? ""
                   : o.certs.empty() ? "; a leader with cluster.certs needs --certs"
                                     : "; with --certs, a leader without TLS or of another CA cannot be reached");
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 5.0);
  }
  const auto leader_name = leader_hello.size() > hello_fields::name ? leader_hello[hello_fields::name] : "?";

  auto waiter = caf::actor_cast<caf::actor>(self);
  node_agent_options ao;
  ao.name = o.name;
  ao.gpus = gpus;
  ao.on_shutdown = [waiter](int32_t code) { caf::anon_send(waiter, shutdown_atom::value, code); };
  auto agent = spawn_node_agent(sys, ao);
  int32_t number = 0;
  std::string failed;
  self->request(door, std::chrono::seconds(30), node_up_atom::value, o.name, agent)
    .receive([&](int32_t n) { number = n; }, [&](caf::error& e) { failed = sys.render(e); });
  if (!failed.empty()) {
    std::fprintf(stderr, "tandem node: the leader at %s did not take this node's agent: %s\n", o.join.c_str(),
                 failed.c_str());
    caf::anon_send(agent, shutdown_atom::value, int32_t{1});
    return 1;
  }
  std::fprintf(stderr, "tandem node '%s': joined leader '%s' at %s as node %d (%s); waiting for its actors\n",
               o.name.c_str(), leader_name.c_str(), o.join.c_str(), number, hello[hello_fields::devices].c_str());
  self->monitor(door);
  int exit_code = 0;
  bool done = false, ended_by_leader = false;
  while (!done) {
    self->receive(
      [&](shutdown_atom, int32_t code) {
        done = true;
        ended_by_leader = true;
        exit_code = code;
        std::fprintf(stderr, "tandem node '%s': the run ended (exit %d)\n", o.name.c_str(), code);
      },
      [&](caf::down_msg& m) {
        done = true;
        exit_code = 1;
        std::fprintf(stderr, "tandem node '%s': the leader at %s is gone (%s): this node's actors stop; "
                             "`tandem run --resume` on the leader continues from its newest checkpoint\n",
                     o.name.c_str(), o.join.c_str(),
                     m.reason ? sys.render(m.reason).c_str() : "its connection closed");
        caf::anon_send(agent, shutdown_atom::value, int32_t{1});
      },
      caf::after(std::chrono::milliseconds(200)) >> [&] {
        if (node_signal.load()) {
          done = true;
          exit_code = 128 + node_signal.load();
          std::fprintf(stderr, "tandem node '%s': signal %d: leaving the cluster\n", o.name.c_str(),
                       node_signal.load());
          caf::anon_send(agent, shutdown_atom::value, int32_t{exit_code});
        }
      });
  }
  {
    // What moving payloads between processes cost this node (host time).
    const auto c = gpu::transport::sharing_cost();
    auto each = [](double ms, uint64_t n) { return n ? ms / static_cast<double>(n) : 0.0; };
    std::fprintf(stderr,
                 "tandem node '%s': shared payloads: %llu published (%.3f ms each), %llu mapped (%.3f ms each), "
                 "%llu released (%.3f ms each); CUDA IPC: %llu published, %llu mapped, %llu allocations opened\n",
                 o.name.c_str(), static_cast<unsigned long long>(c.published), each(c.publish_ms, c.published),
                 static_cast<unsigned long long>(c.mapped), each(c.map_ms, c.mapped),
                 static_cast<unsigned long long>(c.released), each(c.release_ms, c.released),
                 static_cast<unsigned long long>(c.ipc_published), static_cast<unsigned long long>(c.ipc_mapped),
                 static_cast<unsigned long long>(c.ipc_opened));
    if (const auto l = gpu::transport::links_cost(); l.links > 0)
      std::fprintf(stderr,
                   "tandem node '%s': NCCL links: %llu joined, %llu pulls sent (%.1f MB), %llu received "
                   "(%.1f MB, %.3f ms each, host)\n",
                   o.name.c_str(), static_cast<unsigned long long>(l.links),
                   static_cast<unsigned long long>(l.pulls_sent), static_cast<double>(l.bytes_sent) / 1e6,
                   static_cast<unsigned long long>(l.pulls_received), static_cast<double>(l.bytes_received) / 1e6,
                   each(l.receive_ms, l.pulls_received));
  }
  if (ended_by_leader) {
    // The leader closes the connection once every member has said goodbye:
    // leaving earlier could lose this node's goodbye with the connection.
    bool closed = false;
    self->receive_while([&] { return !closed; })(
      [&](caf::down_msg&) { closed = true; }, [&](shutdown_atom, int32_t) {},
      caf::after(std::chrono::seconds(5)) >> [&] { closed = true; });
  }
  // The actors end with the agent; one stuck in a step must not keep the
  // process alive for long.  Without a leader (lost, or a signal) CAF's end
  // can wait for actors that its network layer still references: 5 s.
  const int grace_s = ended_by_leader ? 30 : 5;
  std::thread([exit_code, grace_s] {
    std::this_thread::sleep_for(std::chrono::seconds(grace_s));
    std::fprintf(stderr, "tandem node: its actors did not end within %d s: exiting\n", grace_s);
    leave_now(exit_code);
  }).detach();
  return exit_code;
}

} // namespace

void add_node(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
    "node", "Join a cluster run as a member node: connect to the leader (`tandem run --listen`), retrying until it "
            "is up, and host the actors its placement puts on this node (config/cluster.toml)");
  auto o = std::make_shared<node_options>();
  cmd->add_option("--join", o->join, "The leader's HOST:PORT (HOST: a name or an IP address; off loopback only with --certs)")->required();
  cmd->add_option("--name", o->name, "This node's name, as the placement names it (\"NAME:cuda:0\")")->required();
  cmd->add_option("--devices", o->devices,
                  "\"cpu\", or cuda:0,cuda:1,... (default: every GPU of this host, else the CPU)");
  cmd->add_option("--token-file", o->token_file,
                  "This node's join token (`tandem certs` writes NODE/join.token); needed when the leader has "
                  "cluster.secret");
  cmd->add_option("--certs", o->certs,
                  "This node's folder of `tandem certs DIR --nodes ...` (DIR/NAME: cert.pem, key.pem, ca.pem): TLS "
                  "to the leader, needed when it has cluster.certs and off loopback");
  cmd->add_option("--wait-s", o->wait_s, "How long to keep retrying the join (default 600; at most 30 days)")
    ->check(seconds_up_to(30 * 86400));
  cmd->add_option("--heartbeat-s", o->heartbeat_s, "Seconds between heartbeats to the leader (default 2)")
    ->check(seconds_up_to(86400));
  cmd->add_option("--timeout-s", o->timeout_s,
                  "The leader is gone when its connection is silent this long (default 10)")
    ->check(seconds_up_to(86400));
  cmd->callback([o, &exit_code] { exit_code = run_node(*o); });
}

} // namespace tandem::cli
