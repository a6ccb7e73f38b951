// The descriptors and every type of messages/registry.cpp on the wire: each
// serializes with CAF's binary serializer and comes back equal (field by
// field, tests/protocol/support.hpp), alone and inside a type-erased
// message (which is what crosses nodes, and needs the type registered);
// `to_string` names the type and its fields; Tandem errors keep their code
// and context.  A type registered without a case here fails the coverage
// test.
#define CAF_SUITE messages_protocol

#include <set>

#include "dsl.hpp"
#include "support.hpp"

#include "actors/metrics_lines.hpp"
#include "messages/probe.hpp"
#include "messages/node.hpp"
#include "messages/supervisor.hpp"

using namespace tandem;
using namespace tandem::test;

namespace tandem {
bool operator==(const node_setup& a, const node_setup& b) {
  return a.leader == b.leader && a.config_toml == b.config_toml && a.node_names == b.node_names
         && a.node_gpus == b.node_gpus && a.num_samples == b.num_samples && a.num_tokens == b.num_tokens
         && a.schedule_steps == b.schedule_steps
         && a.resume_checkpoint == b.resume_checkpoint && a.resume_step == b.resume_step
         && a.resume_ledger == b.resume_ledger;
}
} // namespace tandem

namespace {

/// The types with a case below; the last test compares this list with the
/// registry, so a type registered without a case fails the suite.
const std::set<std::string> tested_types{
  "tandem.probe_report", "tandem.device_ref",  "tandem.batch_desc",
  "tandem.features_desc", "tandem.work_item",  "tandem.step_report",
  "tandem.snapshot_desc", "tandem.run_summary", "tandem.int64_list",
  "tandem.coordinator_peers", "tandem.group_spec", "tandem.bytes",
  "tandem.restart_plan", "tandem.drafter_handle", "tandem.coordinator_handle",
  "tandem.run_event", "tandem.eval_event", "tandem.eval_handle",
  "tandem.control_event", "tandem.control_command", "tandem.control_request", "tandem.control_reply",
  "tandem.actor_vitals", "tandem.node_setup", "tandem.node_handle", "tandem.prefetch_handle",
  "tandem.target_handle", "tandem.checkpointer_handle", "tandem.pulled", "tandem.uint64_list",
};

struct fixture : test_coordinator_fixture<config> {
  /// Serializes `x` inside a type-erased message (as the network layer
  /// does), reads it back, and returns element 0.
  template <class T>
  T through_message(const T& x) {
    auto msg = caf::make_message(x);
    caf::message back;
    deserialize(serialize(msg), back);
    CAF_REQUIRE(back.match_elements<T>());
    return back.get_as<T>(0);
  }

  /// Every check of one value: binary round trip, message round trip, text.
  template <class T>
  void check_value(const T& x, const std::string& type_name,
                   const std::vector<std::string>& parts) {
    CAF_CHECK(roundtrip(x) == x);
    CAF_CHECK(through_message(x) == x);
    auto text = caf::deep_to_string(x);
    CAF_MESSAGE(type_name << ": " << text);
    CAF_CHECK(contains(text, type_name));
    for (const auto& p : parts)
      TANDEM_CHECK_MSG(contains(text, p), text << " lacks " << p);
    CAF_CHECK_EQUAL(tested_types.count(type_name), 1u);
  }
};

batch_desc sample_batch() {
  batch_desc b;
  b.batch_id = 41;
  b.epoch = 3;
  b.source = 2;
  b.sample_ids = {7, 19, 1234567890123};
  b.rows = 4;
  b.seq_len = 3072;
  b.real_tokens = 11111;
  b.where = {1, 5};
  b.handle = 0xfedcba9876543210ull;
  return b;
}

features_desc sample_features() {
  features_desc f;
  f.batch_id = 41;
  f.target = 2;
  f.shape = {4, 3072, 5 * 4096};
  f.where = {1, 6};
  f.handle = 0x123456789abcdefull;
  f.forward_ms = 12.625;
  f.dtype = "bfloat16";
  f.host = "node-7 boot 1a2b3c4d";
  return f;
}

} // namespace

CAF_TEST_FIXTURE_SCOPE(messages_protocol_tests, fixture)

CAF_TEST(device_ref batch_desc and features_desc round trip) {
  check_value(device_ref{3, 7}, "tandem.device_ref", {"3", "7"});
  check_value(sample_batch(), "tandem.batch_desc", {"1234567890123", "3072", "11111"});
  check_value(sample_features(), "tandem.features_desc", {"20480", "12.625", "bfloat16", "node-7 boot 1a2b3c4d"});
  // Defaults survive too (batch_id -1, the CPU device).
  CAF_CHECK(roundtrip(batch_desc{}) == batch_desc{});
  CAF_CHECK(roundtrip(features_desc{}).where.device == -1);
}

CAF_TEST(work_item step_report and snapshot_desc round trip) {
  check_value(work_item{sample_batch(), sample_features()}, "tandem.work_item",
              {"tandem.batch_desc", "tandem.features_desc"});
  work_item pad{sample_batch(), sample_features(), false};
  CAF_CHECK(roundtrip(pad) == pad);
  CAF_CHECK(!through_message(pad).contribute);
  step_report r;
  r.drafter = 1;
  r.step = 99;
  r.batch_id = 41;
  r.loss = 2.5;
  r.accuracy = 0.375;
  r.grad_norm = 0.8125;
  r.lr = 6e-4;
  r.scored_tokens = 8192;
  r.real_tokens = 11111;
  r.finite = false;
  r.compute_ms = 135.5;
  r.wait_ms = 1.25;
  r.group_failed = true;
  check_value(r, "tandem.step_report", {"8192", "135.5", "1.25", "false", "true"});
  check_value(snapshot_desc{1, 99, 77}, "tandem.snapshot_desc", {"99", "77"});
}

CAF_TEST(group_spec and the NCCL id bytes round trip) {
  group_spec g;
  g.nccl_id = std::vector<uint8_t>(128, 0);
  for (size_t i = 0; i < g.nccl_id.size(); ++i)
    g.nccl_id[i] = static_cast<uint8_t>(255 - i);
  g.rank = 2;
  g.world = 3;
  g.generation = 7;
  g.timeout_s = 12.5;
  check_value(g, "tandem.group_spec", {"12.5", "7"});
  auto id = g.nccl_id;
  CAF_CHECK(roundtrip(id) == id);
  CAF_CHECK(through_message(id) == id);
  CAF_CHECK_EQUAL(tested_types.count("tandem.bytes"), 1u);
}

CAF_TEST(restart_plan and the actor handles of the supervision messages round trip) {
  check_value(restart_plan{2, 3, 0.5}, "tandem.restart_plan", {"2", "3", "0.5"});
  // Handles travel inside messages (null here: no node to resolve them on).
  CAF_CHECK(!through_message(drafter_actor{}));
  CAF_CHECK(!through_message(coordinator_actor{}));
  CAF_CHECK_EQUAL(tested_types.count("tandem.drafter_handle"), 1u);
  CAF_CHECK_EQUAL(tested_types.count("tandem.coordinator_handle"), 1u);
}

CAF_TEST(run_summary and probe_report round trip) {
  run_summary s;
  s.steps = 400;
  s.epochs_completed = 2;
  s.samples_committed = 64;
  s.last_loss = 1.5;
  s.first_loss = 6.25;
  s.stop_reason = "signal";
  s.checkpoint = "/runs/a/checkpoints/step-00000400";
  check_value(s, "tandem.run_summary", {"signal", "step-00000400", "6.25"});
  probe_report p;
  p.device = 2;
  p.backend = "cuda";
  p.device_name = "NVIDIA H200";
  p.thread_id = "140000";
  p.max_abs_error = 3.5e-6;
  p.elapsed_ms = 0.25;
  p.custom_kernel = true;
  auto back = roundtrip(p);
  CAF_CHECK_EQUAL(back.device, 2);
  CAF_CHECK_EQUAL(back.backend, "cuda");
  CAF_CHECK_EQUAL(back.device_name, "NVIDIA H200");
  CAF_CHECK_EQUAL(back.thread_id, "140000");
  CAF_CHECK_EQUAL(back.max_abs_error, 3.5e-6);
  CAF_CHECK_EQUAL(back.elapsed_ms, 0.25);
  CAF_CHECK_EQUAL(back.custom_kernel, true);
  auto m = through_message(p);
  CAF_CHECK_EQUAL(m.device_name, "NVIDIA H200");
  CAF_CHECK(contains(caf::deep_to_string(p), "tandem.probe_report"));
}

CAF_TEST(every kind of run_event round trips) {
  // Equal means the same metrics.jsonl line (actors/metrics_lines.hpp: every field).
  drafter_failed_event f;
  f.drafter = 1;
  f.reason = "drafter 1 died at step 7: boom";
  f.restore_step = 4;
  f.steps_lost = 2;
  f.restore_from = "checkpoint";
  f.samples_reissued = 12;
  f.checkpoint = "ckpt/step-4";
  f.restart = 1;
  f.budget = 3;
  f.backoff_s = 0.5;
  const std::vector<std::pair<run_event, std::string>> cases{
    {epoch_event{2, 100, 40}, "tandem.epoch_event"},
    {checkpoint_event{8, "ckpt/step-8", 16, 64}, "tandem.checkpoint_event"},
    {checkpoint_discarded_event{8, "ckpt/step-8"}, "tandem.checkpoint_discarded_event"},
    {group_formed_event{3, 2, 1, 9}, "tandem.group_formed_event"},
    {group_step_abandoned_event{1}, "tandem.group_step_abandoned_event"},
    {drafter_failed_event(f), "tandem.drafter_failed_event"},
    {budget_exhausted_event{0, "budget spent"}, "tandem.budget_exhausted_event"},
    {drafter_restarted_event{1, 4, "fresh weights"}, "tandem.drafter_restarted_event"},
    {escalated_event{"target 0 ended", 5}, "tandem.escalated_event"},
    {actor_failed_event{"target", 0, "died", 7, 1, 3, 0.5}, "tandem.actor_failed_event"},
    {actor_restarted_event{"prefetch", 1, 7}, "tandem.actor_restarted_event"},
    {reissued_event{7, 12}, "tandem.reissued_event"},
    {end_event{"signal", 10, "ckpt/step-10"}, "tandem.end_event"},
    {end_event{"max_steps", 30, "ckpt/step-20", 20, "steps 21..30 are lost"}, "tandem.end_event"},
    {checkpoint_skipped_event{40, 20}, "tandem.checkpoint_skipped_event"},
    {restore_point_event{"host", 30, "/dev/shm/tandem-0/run-1/step-30", ""}, "tandem.restore_point_event"},
    {restore_point_event{"host", 40, "", "no space left"}, "tandem.restore_point_event"},
    {eval_event{400, 2.5, 3.25, 8, 40, 100, 250.0, 4.5, "cuda:0", {0, 20, 10, 10}, ""}, "tandem.eval_event"},
    {eval_event{800, 0, 0, 0, 0, 0, 0, 0.5, "cpu", {}, "out of memory"}, "tandem.eval_event"},
    {control_event{"pause", "127.0.0.1:5000 tandem-shell", 12, "paused at step 12"}, "tandem.control_event"},
    {control_event{"lr_scale", "::1 curl", 5, "from step 9", {9, 20}, {0.5, 0.25}}, "tandem.control_event"},
    {resumed_event{20, "ckpt/step-20", "disk", 20, 1.7e9}, "tandem.resumed_event"},
    {worker_restarted_event{"signal 6", 1, 3, 1.7e9}, "tandem.worker_restarted_event"},
  };
  for (const auto& [e, name] : cases) {
    CAF_CHECK_EQUAL(event_line(roundtrip(e)), event_line(e));
    CAF_CHECK_EQUAL(event_line(through_message(e)), event_line(e));
    auto text = caf::deep_to_string(e);
    CAF_MESSAGE(name << ": " << text);
    TANDEM_CHECK_MSG(contains(text, name), text << " lacks " << name);
  }
  CAF_CHECK_EQUAL(tested_types.count("tandem.run_event"), 1u);
  // The eval actor's answer travels alone too (messages/eval.hpp), and its handle.
  const eval_event ev{400, 2.5, 3.25, 8, 40, 100, 250.0, 4.5, "cuda:0", {0, 20, 10, 10}, ""};
  CAF_CHECK_EQUAL(event_line(run_event{roundtrip(ev)}), event_line(run_event{ev}));
  CAF_CHECK_EQUAL(event_line(run_event{through_message(ev)}), event_line(run_event{ev}));
  const run_event as_event = ev;
  const auto line = event_line(as_event);
  CAF_MESSAGE("eval line: " << line.dump());
  CAF_CHECK_EQUAL(line.value("histogram", nlohmann::json()), nlohmann::json::parse("[0, 20, 10, 10]"));
  CAF_CHECK(!through_message(eval_actor{}));
  CAF_CHECK_EQUAL(tested_types.count("tandem.eval_event"), 1u);
  CAF_CHECK_EQUAL(tested_types.count("tandem.eval_handle"), 1u);
}

CAF_TEST(the control endpoint messages round trip) {
  check_value(control_command{"checkpoint", "127.0.0.1:5000 tandem-shell"}, "tandem.control_command",
              {"checkpoint", "tandem-shell"});
  check_value(control_request{"POST", "/v1/steps?n=3", "{\"a\": 1}", "::1 curl"}, "tandem.control_request",
              {"POST", "/v1/steps?n=3"});
  check_value(control_reply{409, "{\"error\": \"stopping\"}"}, "tandem.control_reply", {"409"});
  actor_vitals v;
  v.role = "target";
  v.index = 1;
  v.actor_id = 42;
  v.answered = true;
  v.down = true;
  v.own_thread = true;
  v.thread = 31337;
  v.thread_name = "caf.detached";
  v.uptime_s = 12.5;
  v.handled = 99;
  v.last_message = "tandem.batch_desc";
  v.last_message_age_s = 0.25;
  v.busiest_ms = 80;
  v.figures = {{"forward_ms_last", 7.5}, {"queue_depth", 2}};
  check_value(v, "tandem.actor_vitals", {"target", "31337", "tandem.batch_desc", "forward_ms_last"});
  const std::vector<actor_vitals> all{v, actor_vitals{}};
  CAF_CHECK(through_message(all) == all);  // registered with actor_vitals, as std::vector<tandem.actor_vitals>
  CAF_CHECK_EQUAL(tested_types.count("tandem.control_event"), 1u);
}

CAF_TEST(the link protocol round trips) {
  // A pull names handles; the answer what the target is about to send.
  const std::vector<uint64_t> handles{0xfedcba9876543210ull, 1, 0};
  CAF_CHECK(roundtrip(handles) == handles);
  CAF_CHECK(through_message(handles) == handles);
  pulled p;
  p.payloads = {{{{{4, 3072}, "int32"}, {{4, 3072}, "uint8"}, {{4, 8}, "int64"}}},
                {{{{4, 3072, 20480}, "bfloat16"}}}};
  check_value(p, "tandem.pulled", {"tandem.payload_spec", "tandem.wire_tensor", "20480", "bfloat16", "uint8"});
  CAF_CHECK(roundtrip(pulled{}) == pulled{});
  CAF_CHECK_EQUAL(tested_types.count("tandem.uint64_list"), 1u);
  // A features descriptor names its producer: the handle travels with it.
  auto target = sys.spawn([]() -> caf::behavior { return {[](int32_t) {}}; });
  auto f = sample_features();
  f.producer = target;
  const auto back = through_message(f);
  CAF_CHECK(back == f);
  CAF_CHECK(back.producer == target);
  caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
}

CAF_TEST(the node protocol round trips) {
  node_setup setup{"leader", "[model]\ntarget = \"/m\"\n", {"leader", "gpu-a", "gpu-b"}, {0, 2, 1}, 128, 32768, 1234,
                   "/ckpt/step-00000020", 20, "{\"epoch\": 0}"};
  check_value(setup, "tandem.node_setup", {"gpu-a", "step-00000020"});
  // The handles a member's agent answers with, and its own (null here).
  CAF_CHECK(!through_message(node_actor{}));
  CAF_CHECK(!through_message(prefetch_actor{}));
  CAF_CHECK(!through_message(target_actor{}));
  CAF_CHECK(!through_message(checkpointer_actor{}));
  for (const auto* t : {"tandem.node_handle", "tandem.prefetch_handle", "tandem.target_handle",
                        "tandem.checkpointer_handle"})
    CAF_CHECK_EQUAL(tested_types.count(t), 1u);
  // The hello: plain strings only, whatever the build.
  const std::vector<std::string> hello{hello_fields::protocol_name, "0.4.0", "abc", "2.11.0", "13.0", "2.28.9",
                                       "gpu-a", "", "cpu", "42", "node-7 boot 1a2b3c4d"};
  auto back = through_message(hello);
  CAF_CHECK(back == hello);
  CAF_CHECK_EQUAL(hello.size(), hello_fields::count);
}

CAF_TEST(the int64 list and coordinator_peers round trip) {
  std::vector<int64_t> ids{0, -1, 1ll << 40};
  CAF_CHECK(roundtrip(ids) == ids);
  CAF_CHECK(through_message(ids) == ids);
  // Actor handles serialize as (node, id) and come back as the same actors
  // in this system; null handles stay null.
  auto dummy = [](caf::event_based_actor*) -> caf::behavior { return {[](caf::ok_atom) {}}; };
  coordinator_peers p;
  p.prefetch.push_back(caf::actor_cast<prefetch_actor>(sys.spawn(dummy)));
  p.prefetch.push_back(caf::actor_cast<prefetch_actor>(sys.spawn(dummy)));
  p.targets.push_back(caf::actor_cast<target_actor>(sys.spawn(dummy)));
  p.targets.push_back(caf::actor_cast<target_actor>(sys.spawn(dummy)));
  p.drafters.push_back(caf::actor_cast<drafter_actor>(sys.spawn(dummy)));
  p.metrics = caf::actor_cast<metrics_actor>(sys.spawn(dummy));
  // checkpointer left null
  auto back = roundtrip(p);
  CAF_CHECK(back == p);
  CAF_CHECK(!back.checkpointer);
  CAF_CHECK(back.prefetch[1] == p.prefetch[1]);
  CAF_CHECK(through_message(p) == p);
  CAF_CHECK(contains(caf::deep_to_string(p), "tandem.coordinator_peers"));
  for (auto& x : p.prefetch)
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  for (auto& x : p.targets)
    caf::anon_send_exit(x, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(p.drafters[0], caf::exit_reason::user_shutdown);
  caf::anon_send_exit(p.metrics, caf::exit_reason::user_shutdown);
}

CAF_TEST(every protocol message serializes as a message) {
  // One message per handler of every interface in messages/: what a peer
  // on another node would receive.  Element types must all be registered.
  auto check = [&](caf::message msg) {
    caf::message back;
    deserialize(serialize(msg), back);
    CAF_CHECK_EQUAL(caf::to_string(back), caf::to_string(msg));
    CAF_CHECK_EQUAL(back.type_token(), msg.type_token());
  };
  const std::vector<int64_t> ids{1, 2, 3};
  // prefetch
  check(caf::make_message(epoch_atom::value, int64_t{2}, int64_t{5}, ids));
  check(caf::make_message(credit_atom::value, int32_t{4}));
  check(caf::make_message(reissue_atom::value, ids));
  check(caf::make_message(release_atom::value, uint64_t{77}));
  check(caf::make_message(shutdown_atom::value));
  // target, drafter, coordinator's inputs
  check(caf::make_message(sample_batch()));
  check(caf::make_message(work_item{sample_batch(), sample_features()}));
  check(caf::make_message(step_report{}));
  check(caf::make_message(snapshot_atom::value));
  check(caf::make_message(exhausted_atom::value, int32_t{1}, int64_t{2}));
  check(caf::make_message(run_atom::value, coordinator_peers{}));
  check(caf::make_message(stop_atom::value));
  check(caf::make_message(status_atom::value));
  check(caf::make_message(tick_atom::value));
  check(caf::make_message(drafter_down_atom::value, int32_t{1}, std::string("died")));
  check(caf::make_message(drafter_up_atom::value, int32_t{1}, drafter_actor{}));
  check(caf::make_message(escalate_atom::value, std::string("target 0 ended")));
  check(caf::make_message(escalate_atom::value, bad_input_atom::value, std::string("prefetch 0 ended")));
  check(caf::make_message(escalate_atom::value, int32_t{1}, std::string("drafter 1 given up")));
  check(caf::make_message(escalate_atom::value, bad_input_atom::value, int32_t{1}, std::string("drafter 1 refused")));
  check(caf::make_message(device_lost_atom::value, std::string("illegal memory access")));
  check(caf::make_message(worker_down_atom::value, std::string("target"), int32_t{0}, std::string("died")));
  check(caf::make_message(worker_up_atom::value, int32_t{0}, target_actor{}));
  check(caf::make_message(worker_up_atom::value, int32_t{0}, prefetch_actor{}));
  // supervisor
  check(caf::make_message(supervise_atom::value, coordinator_actor{}, coordinator_peers{}));
  check(caf::make_message(restart_atom::value, int32_t{0}, std::string("nan"), std::string("ckpt/step-4")));
  check(caf::make_message(respawn_atom::value, int32_t{0}, std::string("ckpt/step-4")));
  check(caf::make_message(restart_atom::value, std::string("prefetch"), int32_t{1}, std::string("died")));
  check(caf::make_message(respawn_atom::value, std::string("target"), int32_t{1}));
  check(caf::make_message(hurry_atom::value));
  // checkpointer, metrics
  check(caf::make_message(snapshot_desc{0, 5, 9}, std::string("{\"ledger\":{}}")));
  check(caf::make_message(event_atom::value, std::string("{\"event\":\"x\"}")));
  check(caf::make_message(run_event{end_event{"signal", 3, ""}}));
  // replies
  check(caf::make_message(run_summary{}));
  check(caf::make_message(restart_plan{2, 3, 0.5}));
  check(caf::make_message(probe_atom::value, int32_t{0}));
  // node (messages/node.hpp)
  check(caf::make_message(join_atom::value, std::vector<std::string>{"tandem-node-hello/1", "x"}));
  check(caf::make_message(node_up_atom::value, std::string("gpu-a"), node_actor{}));
  check(caf::make_message(setup_atom::value, node_setup{}));
  check(caf::make_message(setup_atom::value, node_setup{}, 300.0, std::vector<std::string>{"gpu-c:cuda:0"},
                          std::vector<std::string>{"gpu-b"}));
  check(caf::make_message(spawn_prefetch_atom::value, int32_t{0}, coordinator_actor{}));
  check(caf::make_message(spawn_target_atom::value, int32_t{0}, coordinator_actor{}));
  check(caf::make_message(spawn_drafter_atom::value, int32_t{0}, std::string("ckpt/step-4"), coordinator_actor{}));
  check(caf::make_message(spawn_drafter_atom::value, std::string("gpu-b"), int32_t{0}, std::string(""),
                          coordinator_actor{}));
  check(caf::make_message(spawn_ckpt_atom::value, int32_t{1}));
  check(caf::make_message(spawn_ckpt_atom::value, std::string("gpu-b"), int32_t{1}));
  check(caf::make_message(shutdown_atom::value, int32_t{0}));
}

CAF_TEST(tandem errors keep their code and context) {
  for (auto code : {errc::device_unavailable, errc::device_failure, errc::wrong_result,
                    errc::bad_input, errc::timeout, errc::unexpected_message}) {
    auto err = make_error(code, "drafter 0: step 12 (context)");
    auto back = roundtrip(err);
    CAF_CHECK(back == err);
    CAF_CHECK(is(back, code));
    auto text = sys.render(back);
    CAF_CHECK_EQUAL(text, "tandem." + to_string(code) + ": drafter 0: step 12 (context)");
    // An error inside a message (an async error reply) too.
    auto msg = caf::make_message(err);
    caf::message m;
    deserialize(serialize(msg), m);
    CAF_REQUIRE(m.match_elements<caf::error>());
    CAF_CHECK(m.get_as<caf::error>(0) == err);
  }
  CAF_CHECK_EQUAL(sys.render(make_error(errc::timeout)), "tandem.timeout");
}

CAF_TEST(every registered tandem type has a case above) {
  std::set<std::string> registered;
  for (auto& [rtti, name] : cfg.type_names_by_rtti)
    if (name.rfind("tandem.", 0) == 0)
      registered.insert(name);
  for (auto& name : registered)
    TANDEM_CHECK_MSG(tested_types.count(name) == 1, name << " is registered but has no round trip case");
  for (auto& name : tested_types)
    TANDEM_CHECK_MSG(registered.count(name) == 1, name << " has a case but is not registered");
}

CAF_TEST_FIXTURE_SCOPE_END()
