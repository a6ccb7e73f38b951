#include "launch/plan.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace tandem {

namespace {

/// Optimizer steps in `epochs` passes over the data: as counted (data.steps),
/// else one packed batch of rows × seq_len tokens per step at ~90% fill,
/// rounded up.
int64_t schedule_steps(const run_config& c, const data_facts& data) {
  if (data.steps > 0)
    return data.steps;
  const double tokens_per_batch = static_cast<double>(c.data.rows * c.data.seq_len) * 0.9;
  return static_cast<int64_t>(static_cast<double>(data.num_tokens) * static_cast<double>(c.data.epochs)
                              / tokens_per_batch)
         + 1;
}

} // namespace

std::filesystem::path host_restore_dir(const run_config& c) {
  if (!c.checkpoint.host_dir.empty())
    return c.checkpoint.host_dir.is_absolute() ? c.checkpoint.host_dir : c.run.output_dir / c.checkpoint.host_dir;
  // FNV-1a of the output folder: two runs of one name in different places
  // never share restore points.
  uint32_t h = 2166136261u;
  for (const unsigned char ch : std::filesystem::absolute(c.run.output_dir).lexically_normal().string())
    h = (h ^ ch) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", h);
  std::string name = c.run.name;
  for (auto& ch : name)
    if (ch == '/' || ch == '\\' || ch == ' ')
      ch = '_';
  return std::filesystem::path("/dev/shm") / ("tandem-" + std::to_string(::getuid())) / (name + "-" + hex);
}

launch_plan make_plan(const run_config& c, const inventory& devices, const data_facts& data,
                      const std::optional<resume_point>& resume) {
  const std::string at = c.source.empty() ? "" : c.source.string() + ": ";
  if (devices.nodes.empty())
    throw config_error(at + "make_plan: an empty inventory (no node to place the actors on)");
  std::vector<member_devices> members;
  for (size_t i = 1; i < devices.nodes.size(); ++i)
    members.push_back({devices.nodes[i].name, devices.nodes[i].gpus});
  launch_plan p;
  p.run_name = c.run.name;
  p.output_dir = c.run.output_dir;
  p.placement = resolve_placement(c, devices.nodes.front().gpus, members);
  for (const auto& d : p.placement.drafters)
    p.coordinator.drafter_nodes.push_back(d.node);
  p.schedule_steps = schedule_steps(c, data);

  auto& co = p.coordinator;
  co.num_samples = data.num_samples;
  co.data_hash = data.content_hash;
  co.schedule_steps = p.schedule_steps;
  co.credits = static_cast<int32_t>(c.runtime.credits);
  co.max_steps = c.train.max_steps;
  co.epochs = c.data.epochs;
  co.log_every = c.train.log_every;
  co.checkpoint_every = c.checkpoint.every_steps;
  co.host_every = c.checkpoint.host_every;
  co.checkpoint_on_stop = c.checkpoint.on_signal;
  co.step_timeout_s = c.runtime.step_timeout_s;
  co.heartbeat_s = c.runtime.heartbeat_s;
  co.group_timeout_s = c.runtime.group_timeout_s;
  if (resume) {
    co.resume_ledger = resume->ledger;
    co.resume_step = resume->step;
    co.resume_checkpoint = resume->checkpoint;
    co.resume_on_disk = resume->on_disk;
    co.resume_lr_scale = resume->lr_scale;
    p.restore_from = resume->checkpoint;
  }
  p.checkpoint_on_signal = c.checkpoint.on_signal;

  p.supervisor.restart_budget = c.supervision.restart_budget;
  p.supervisor.backoff_s = c.supervision.backoff_s;
  p.supervisor.window_s = c.supervision.window_s;

  p.metrics.run_name = c.run.name;
  p.metrics.jsonl = c.metrics_file();
  p.metrics.tensorboard = c.tensorboard_dir();
  p.metrics.lr_schedule = c.lr_schedule_file();
  p.metrics.progress = c.metrics.progress;
  p.metrics.every_s = c.metrics.every_s;
  p.metrics.total_steps = c.train.max_steps > 0 ? std::min(c.train.max_steps, p.schedule_steps)
                                                : p.schedule_steps;
  p.metrics.log_every = c.train.log_every;

  if (!c.cluster.listen.empty()) {
    const auto a = parse_listen(c.cluster.listen);  // checked when the config was read
    launch_plan::cluster_settings cs;
    cs.host = a->host;
    cs.port = a->port;
    cs.name = c.cluster.name;
    cs.members = p.placement.nodes();
    cs.join_timeout_s = c.cluster.join_timeout_s;
    cs.heartbeat_s = c.cluster.heartbeat_s;
    cs.timeout_s = c.cluster.timeout_s;
    cs.secret = c.cluster.secret.string();
    cs.certs = c.cluster.certs.string();
    cs.force_links = c.cluster.transport == "nccl";
    cs.link_timeout_s = c.cluster.link_timeout_s();
    p.cluster = std::move(cs);
  }
  if (!c.control.listen.empty()) {
    const auto a = parse_listen(c.control.listen);  // checked when the config was read
    control_options co;
    co.host = a->host == "localhost" ? "127.0.0.1" : a->host;
    co.port = a->port;
    co.tls_cert = c.control.tls_cert.string();
    co.tls_key = c.control.tls_key.string();
    co.run_name = c.run.name;
    // In a cluster run every actor names its node (the leader's own: cluster.name).
    const auto leader = p.placement.nodes().empty() ? std::string() : c.cluster.name;
    co.actors.push_back({"coordinator", 0, "cpu", leader});
    co.actors.push_back({"supervisor", 0, "cpu", leader});
    for (const auto* role : {&p.placement.prefetch, &p.placement.targets, &p.placement.drafters, &p.placement.eval})
      for (const auto& slot : *role)
        co.actors.push_back({slot.role, slot.index, device_string(slot.device), slot.node.empty() ? leader : slot.node});
    co.actors.push_back({"checkpointer", 0, "cpu", leader});
    co.actors.push_back({"metrics", 0, "cpu", leader});
    co.actors.push_back({"control", 0, "cpu", leader});
    p.control = std::move(co);
  }

  p.checkpointer.dir = c.checkpoint_dir();
  p.checkpointer.keep = static_cast<int>(c.checkpoint.keep);
  p.host_checkpointer.dir = host_restore_dir(c);
  p.host_checkpointer.keep = 1;
  p.gpu_memory_fraction = c.runtime.gpu_memory_fraction;
  p.worker_restarts = c.supervision.worker_restarts;

  const auto world = static_cast<int32_t>(p.placement.targets.size());
  for (const auto& t : p.placement.targets) {
    gpu::prefetch_engine_options po;
    po.dataset = c.data.path;
    po.device = t.device;
    po.rows = c.data.rows;
    po.seq_len = c.data.seq_len;
    po.max_docs = c.data.max_docs;
    po.lookahead = c.data.lookahead;
    po.seed = c.data.seed;
    po.rank = t.index;
    po.world = world;
    po.target = c.model.target;  // the manifest and every token id are checked against it
    po.mask_token_id = c.drafter.mask_token_id;
    p.prefetch.push_back(po);
    gpu::target_engine_options to;
    to.dir = c.model.target;
    to.device = t.device;
    to.dtype = c.model.dtype;
    to.tap_ids = c.model.tap_layers;
    p.targets.push_back(to);
  }
  for (const auto& d : p.placement.drafters) {
    gpu::drafter_engine_options o;
    o.target_dir = c.model.target;
    o.device = d.device;
    o.dtype = c.model.dtype;
    o.layers = c.drafter.layers;
    o.block_size = c.drafter.block_size;
    o.mask_token_id = c.drafter.mask_token_id;
    o.init_from = c.drafter.init_from;
    o.anchors = c.data.anchors;
    o.chunk_rows = c.train.chunk_rows;
    o.tap_ids = c.model.tap_layers;
    // Each rank's own seed; join_group makes the replicas equal anyway.
    o.seed = c.drafter.seed + static_cast<uint64_t>(d.index);
    o.lr = c.train.lr;
    o.warmup_ratio = c.train.warmup_ratio;
    o.weight_decay = c.train.weight_decay;
    o.grad_clip = c.train.grad_clip;
    o.beta1 = c.train.beta1;
    o.beta2 = c.train.beta2;
    o.eps = c.train.eps;
    o.total_steps = p.schedule_steps;
    o.capture_graphs = c.runtime.capture_graphs;
    // Data-parallel drafters restore from a live peer instead.
    o.memory_every = p.placement.drafters.size() == 1 ? c.checkpoint.memory_every : 0;
    o.memory_slot = d.index;
    // Snapshots (checkpoints, restore points, evaluations, the final
    // checkpoint) come from drafter 0, or with data-parallel drafters from
    // the first clean one (coordinator snapshot_source): the others make
    // their sets only if they are ever asked.
    o.prepare_snapshot_buffers = d.index == 0;
    p.drafters.push_back(o);
  }
  p.faults = c.faults;
  for (const auto& f : p.faults) {
    const auto& slots = f.role == "target" ? p.placement.targets
                        : f.role == "prefetch" ? p.placement.prefetch : p.placement.drafters;
    if (f.drafter >= static_cast<int64_t>(slots.size()))
      throw config_error(at + "fault " + f.to_string() + ": there is no " + f.role + " " + std::to_string(f.drafter)
                         + " (" + std::to_string(slots.size()) + " in placement)");
    if ((f.kind == "cuda_error" || f.kind == "cuda_sticky")
        && (f.drafter >= static_cast<int64_t>(p.drafters.size()) || p.drafters[static_cast<size_t>(f.drafter)].device < 0))
      throw config_error(at + "fault " + f.to_string() + ": kind " + f.kind + " needs drafter "
                         + std::to_string(f.drafter) + " on a CUDA device (placement.drafters)");
  }
  p.hang_s = 2 * c.runtime.step_timeout_s + 1;
  p.slow_snapshot_s = 2 * c.runtime.heartbeat_s + 1;
  if (!p.placement.eval.empty()) {
    gpu::eval_engine_options e;
    e.target_dir = c.model.target;
    e.device = p.placement.eval.front().device;
    e.dtype = c.model.dtype;
    e.max_new_tokens = c.eval.max_new_tokens;
    e.temperature = c.eval.temperature;
    e.seed = c.drafter.seed;
    p.eval = e;
    p.eval_prompts = c.eval.prompts;
    p.eval_count = c.eval.count;
    co.eval_every = c.eval.every_steps;
    co.eval_at_end = c.eval.at_end;
  }
  return p;
}

std::vector<std::string> eval_prompt_arguments(const run_config& c, const std::filesystem::path& out) {
  if (c.eval.prompts.empty())
    return {};
  const auto tokenizer = c.data.tokenizer.empty() ? c.model.target : c.data.tokenizer;
  return {c.eval.prompts.string(), "--tokenizer", tokenizer.string(), "--prompts-out", out.string(),
          "--limit", std::to_string(c.eval.count), "--quiet"};
}

std::vector<std::string> prepare_arguments(const run_config& c) {
  if (c.data.sources.empty())
    return {};
  std::vector<std::string> args{"--tokenizer", c.data.tokenizer.string(), "--output",
                                c.data.path.string(), "--reuse", "--block-size",
                                std::to_string(c.drafter.block_size), "--max-length",
                                std::to_string(std::max<int64_t>(3072, c.data.seq_len))};
  if (!c.metrics.progress)
    args.push_back("--quiet");
  for (const auto& src : c.data.sources)
    args.push_back(src.string());
  return args;
}

std::string to_json(const launch_plan& p) {
  using nlohmann::json;
  auto slots = [](const std::vector<placement_plan::slot>& v) {
    json a = json::array();
    for (const auto& s : v) {
      json slot = {{"role", s.role}, {"index", s.index}, {"device", device_string(s.device)}};
      if (!s.node.empty())
        slot["node"] = s.node;
      a.push_back(std::move(slot));
    }
    return a;
  };
  json j;
  j["run_name"] = p.run_name;
  j["output_dir"] = p.output_dir.string();
  j["placement"] = {{"targets", slots(p.placement.targets)},
                    {"drafters", slots(p.placement.drafters)},
                    {"spares", slots(p.placement.spares)},
                    {"prefetch", slots(p.placement.prefetch)},
                    {"eval", slots(p.placement.eval)}};
  j["schedule_steps"] = p.schedule_steps;
  const auto& co = p.coordinator;
  j["coordinator"] = {{"num_samples", co.num_samples}, {"credits", co.credits},
                      {"max_steps", co.max_steps}, {"epochs", co.epochs}, {"log_every", co.log_every},
                      {"checkpoint_every", co.checkpoint_every}, {"host_every", co.host_every},
                      {"checkpoint_on_stop", co.checkpoint_on_stop},
                      {"resume_ledger", co.resume_ledger}, {"resume_step", co.resume_step},
                      {"resume_checkpoint", co.resume_checkpoint},
                      {"step_timeout_s", co.step_timeout_s}, {"heartbeat_s", co.heartbeat_s},
                      {"group_timeout_s", co.group_timeout_s}, {"eval_every", co.eval_every},
                      {"eval_at_end", co.eval_at_end}, {"eval_timeout_s", co.eval_timeout_s}};
  j["supervisor"] = {{"restart_budget", p.supervisor.restart_budget},
                     {"backoff_s", p.supervisor.backoff_s}, {"window_s", p.supervisor.window_s}};
  j["metrics"] = {{"run_name", p.metrics.run_name}, {"jsonl", p.metrics.jsonl.string()},
                  {"tensorboard", p.metrics.tensorboard.string()},
                  {"progress", p.metrics.progress}, {"every_s", p.metrics.every_s},
                  {"total_steps", p.metrics.total_steps}, {"log_every", p.metrics.log_every}};
  j["checkpointer"] = {{"dir", p.checkpointer.dir.string()}, {"keep", p.checkpointer.keep}};
  j["host_checkpointer"] = {{"dir", p.host_checkpointer.dir.string()}, {"keep", p.host_checkpointer.keep}};
  j["gpu_memory_fraction"] = p.gpu_memory_fraction;
  j["worker_restarts"] = p.worker_restarts;
  j["prefetch"] = json::array();
  for (const auto& o : p.prefetch)
    j["prefetch"].push_back({{"dataset", o.dataset.string()}, {"device", device_string(o.device)},
                             {"rows", o.rows}, {"seq_len", o.seq_len}, {"max_docs", o.max_docs},
                             {"lookahead", o.lookahead}, {"seed", o.seed}, {"rank", o.rank},
                             {"world", o.world}, {"target", o.target.string()},
                             {"verify_shards", o.verify_shards}, {"verify_hashes", o.verify_hashes}});
  j["targets"] = json::array();
  for (const auto& o : p.targets)
    j["targets"].push_back({{"dir", o.dir.string()}, {"device", device_string(o.device)},
                            {"dtype", o.dtype}, {"tap_ids", o.tap_ids}});
  j["drafters"] = json::array();
  for (const auto& o : p.drafters)
    j["drafters"].push_back(
      {{"target_dir", o.target_dir.string()}, {"device", device_string(o.device)}, {"dtype", o.dtype},
       {"layers", o.layers}, {"block_size", o.block_size}, {"mask_token_id", o.mask_token_id},
       {"anchors", o.anchors}, {"chunk_rows", o.chunk_rows}, {"tap_ids", o.tap_ids},
       {"seed", o.seed}, {"lr", o.lr}, {"warmup_ratio", o.warmup_ratio},
       {"weight_decay", o.weight_decay}, {"grad_clip", o.grad_clip}, {"beta1", o.beta1},
       {"beta2", o.beta2}, {"eps", o.eps}, {"total_steps", o.total_steps},
       {"capture_graphs", o.capture_graphs}, {"init_from", o.init_from.string()},
       {"memory_every", o.memory_every}, {"memory_slot", o.memory_slot},
       {"prepare_snapshot_buffers", o.prepare_snapshot_buffers}});
  j["faults"] = json::array();
  for (const auto& f : p.faults)
    j["faults"].push_back(f.to_string());
  j["hang_s"] = p.hang_s;
  j["slow_snapshot_s"] = p.slow_snapshot_s;
  j["restore_from"] = p.restore_from;
  j["checkpoint_on_signal"] = p.checkpoint_on_signal;
  if (p.eval)
    j["eval"] = {{"target_dir", p.eval->target_dir.string()}, {"device", device_string(p.eval->device)},
                 {"dtype", p.eval->dtype}, {"max_new_tokens", p.eval->max_new_tokens},
                 {"temperature", p.eval->temperature}, {"seed", p.eval->seed},
                 {"prompts", p.eval_prompts.string()}, {"count", p.eval_count}};
  if (p.cluster)
    j["cluster"] = {{"host", p.cluster->host},           {"port", p.cluster->port},
                    {"name", p.cluster->name},           {"members", p.cluster->members},
                    {"join_timeout_s", p.cluster->join_timeout_s}, {"heartbeat_s", p.cluster->heartbeat_s},
                    {"timeout_s", p.cluster->timeout_s}, {"secret", p.cluster->secret},
                    {"certs", p.cluster->certs},         {"force_links", p.cluster->force_links},
                    {"link_timeout_s", p.cluster->link_timeout_s}};
  if (p.control) {
    auto actors = nlohmann::json::array();
    for (const auto& a : p.control->actors)
      actors.push_back(a.role + " " + std::to_string(a.index) + " " + (a.node.empty() ? "" : a.node + ":") + a.device);
    j["control"] = {{"host", p.control->host}, {"port", p.control->port}, {"tls_cert", p.control->tls_cert},
                    {"tls_key", p.control->tls_key}, {"actors", actors}};
  }
  return j.dump(2);
}

} // namespace tandem
