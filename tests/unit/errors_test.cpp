#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "messages/errors.hpp"
#include "messages/registry.hpp"

using namespace tandem;

namespace {
struct config : caf::actor_system_config {
  config() {
    register_messages(*this);
  }
};
} // namespace

TEST(errors, render_names_code_and_context) {
  config cfg;
  caf::actor_system sys{cfg};
  auto err = make_error(errc::bad_input, "config/tiny.toml: field 'model.layers' must be > 0");
  EXPECT_EQ(sys.render(err),
            "tandem.bad_input: config/tiny.toml: field 'model.layers' must be > 0");
  EXPECT_EQ(sys.render(make_error(errc::timeout)), "tandem.timeout");
}

TEST(errors, every_code_has_a_name) {
  for (uint8_t c = 1; c <= static_cast<uint8_t>(errc::unexpected_message); ++c)
    EXPECT_EQ(to_string(static_cast<errc>(c)).find("errc("), std::string::npos) << int(c);
}

TEST(errors, enum_converts_implicitly_to_caf_error) {
  caf::error e = errc::device_failure;
  EXPECT_EQ(e.category(), error_category);
  EXPECT_EQ(e.code(), static_cast<uint8_t>(errc::device_failure));
}
