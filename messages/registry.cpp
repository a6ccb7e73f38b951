#include "messages/registry.hpp"

#include <caf/all.hpp>

#include "messages/control.hpp"
#include "messages/coordinator.hpp"
#include "messages/descriptors.hpp"
#include "messages/errors.hpp"
#include "messages/metrics.hpp"
#include "messages/node.hpp"
#include "messages/probe.hpp"
#include "messages/supervisor.hpp"
#include "messages/target.hpp"
#include "messages/vitals.hpp"

namespace tandem {

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_error_category(
    error_category,
    [](uint8_t code, caf::atom_value, const caf::message& ctx) -> std::string {
      auto text = "tandem." + to_string(static_cast<errc>(code));
      if (!ctx.empty())
        text += ": " + (ctx.match_element<std::string>(0) ? ctx.get_as<std::string>(0) : to_string(ctx));
      return text;
    });
  // Append only, below this line.
  cfg.add_message_type<probe_report>("tandem.probe_report");
  cfg.add_message_type<device_ref>("tandem.device_ref");
  cfg.add_message_type<batch_desc>("tandem.batch_desc");
  cfg.add_message_type<features_desc>("tandem.features_desc");
  cfg.add_message_type<work_item>("tandem.work_item");
  cfg.add_message_type<step_report>("tandem.step_report");
  cfg.add_message_type<snapshot_desc>("tandem.snapshot_desc");
  cfg.add_message_type<run_summary>("tandem.run_summary");
  cfg.add_message_type<std::vector<int64_t>>("tandem.int64_list");
  cfg.add_message_type<coordinator_peers>("tandem.coordinator_peers");
  cfg.add_message_type<group_spec>("tandem.group_spec");
  cfg.add_message_type<std::vector<uint8_t>>("tandem.bytes");
  cfg.add_message_type<restart_plan>("tandem.restart_plan");
  cfg.add_message_type<drafter_actor>("tandem.drafter_handle");
  cfg.add_message_type<coordinator_actor>("tandem.coordinator_handle");
  cfg.add_message_type<run_event>("tandem.run_event");
  cfg.add_message_type<eval_event>("tandem.eval_event");
  cfg.add_message_type<eval_actor>("tandem.eval_handle");
  cfg.add_message_type<control_event>("tandem.control_event");
  cfg.add_message_type<control_command>("tandem.control_command");
  cfg.add_message_type<control_request>("tandem.control_request");
  cfg.add_message_type<control_reply>("tandem.control_reply");
  cfg.add_message_type<actor_vitals>("tandem.actor_vitals");  // and its std::vector (CAF adds it)
  cfg.add_message_type<node_setup>("tandem.node_setup");
  cfg.add_message_type<node_actor>("tandem.node_handle");
  cfg.add_message_type<prefetch_actor>("tandem.prefetch_handle");
  cfg.add_message_type<target_actor>("tandem.target_handle");
  cfg.add_message_type<checkpointer_actor>("tandem.checkpointer_handle");
  cfg.add_message_type<pulled>("tandem.pulled");
  cfg.add_message_type<std::vector<uint64_t>>("tandem.uint64_list");
}

} // namespace tandem
