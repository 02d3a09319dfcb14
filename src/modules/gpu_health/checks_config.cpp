// The `checks:` section (see checks_config.hpp).
#include "modules/gpu_health/checks_config.hpp"

namespace gns::gpu_health {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kMinInterval{100};
constexpr milliseconds kMaxInterval = std::chrono::hours(24);
constexpr milliseconds kMaxWindow = std::chrono::hours(24);

// `key: {enabled: bool}`; missing: `fallback`.
bool Switch(ConfigMap& group, std::string_view key, bool fallback) {
  ConfigMap check = group.Section(key);
  const bool on = check.Bool("enabled", fallback);
  check.Finish();
  return on;
}

// `key: {enabled, perMinute, window}`.
RateSetting Rate(ConfigMap& group, std::string_view key, RateSetting fallback) {
  ConfigMap check = group.Section(key);
  RateSetting out;
  out.enabled = check.Bool("enabled", fallback.enabled);
  out.per_minute = check.Double("perMinute", 0.001, 1e9, fallback.per_minute);
  out.window = check.Duration("window", std::chrono::minutes(1), kMaxWindow, fallback.window);
  check.Finish();
  return out;
}

// A group's `enabled` and `interval`; returns the interval, 0 when off.
milliseconds Group(ConfigMap& group, milliseconds fallback) {
  const bool on = group.Bool("enabled", true);
  const milliseconds interval = group.Duration("interval", kMinInterval, kMaxInterval, fallback);
  return on ? interval : milliseconds(0);
}

}  // namespace

ChecksConfig ParseChecksConfig(ConfigMap& section) {
  ChecksConfig config;
  ConfigMap checks = section.Section("checks");
  config.enabled = checks.Bool("enabled", config.enabled);
  config.clear_after = static_cast<uint32_t>(checks.Int("clearAfterPasses", 1, 100, config.clear_after));
  config.pass_timeout = checks.Duration("passTimeout", std::chrono::seconds(1), std::chrono::hours(1), config.pass_timeout);

  {
    ConfigMap g = checks.Section("memory");
    config.intervals[0] = Group(g, config.intervals[0]);
    auto& m = config.memory;
    m.row_remap_failed = Switch(g, "rowRemapFailed", m.row_remap_failed);
    m.row_remap_pending = Switch(g, "rowRemapPending", m.row_remap_pending);
    m.row_remap_spares_exhausted = Switch(g, "rowRemapSparesExhausted", m.row_remap_spares_exhausted);
    m.retired_pages_pending = Switch(g, "retiredPagesPending", m.retired_pages_pending);
    {
      ConfigMap limit = g.Section("retiredPagesLimit");
      m.retired_pages_limit = limit.Bool("enabled", m.retired_pages_limit);
      m.retired_pages_max = static_cast<uint32_t>(limit.Int("pages", 1, 1'000'000, m.retired_pages_max));
      limit.Finish();
    }
    m.ecc_uncorrectable_volatile = Switch(g, "eccUncorrectableVolatile", m.ecc_uncorrectable_volatile);
    m.ecc_correctable_rate = Rate(g, "eccCorrectableRate", m.ecc_correctable_rate);
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("nvlink");
    config.intervals[1] = Group(g, config.intervals[1]);
    config.nvlink.nvlink_down = Switch(g, "nvLinkDown", config.nvlink.nvlink_down);
    config.nvlink.error_rate = Rate(g, "nvLinkErrorRate", config.nvlink.error_rate);
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("fabric");
    config.intervals[2] = Group(g, config.intervals[2]);
    auto& f = config.fabric;
    {
      ConfigMap c = g.Section("fabricNotRegistered");
      f.not_registered = c.Bool("enabled", f.not_registered);
      f.registration_grace = c.Duration("grace", milliseconds(0), std::chrono::hours(1), f.registration_grace);
      c.Finish();
    }
    f.degraded = Switch(g, "fabricDegraded", f.degraded);
    f.recovery = Switch(g, "fabricRecovery", f.recovery);
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("pcie");
    config.intervals[3] = Group(g, config.intervals[3]);
    config.pcie.link_degraded = Switch(g, "pcieLinkDegraded", config.pcie.link_degraded);
    config.pcie.replay_rate = Rate(g, "pcieReplayRate", config.pcie.replay_rate);
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("thermal");
    config.intervals[4] = Group(g, config.intervals[4]);
    auto& t = config.thermal;
    t.clock_event_rate = Rate(g, "clockEventRate", t.clock_event_rate);
    t.hw_slowdown = Switch(g, "clockEventHwSlowdown", t.hw_slowdown);
    t.hw_thermal = Switch(g, "clockEventHwThermal", t.hw_thermal);
    t.hw_power_brake = Switch(g, "clockEventHwPowerBrake", t.hw_power_brake);
    t.sw_thermal = Switch(g, "clockEventSwThermal", t.sw_thermal);
    {
      ConfigMap c = g.Section("thermalMargin");
      t.thermal_margin = c.Bool("enabled", t.thermal_margin);
      t.margin_c = static_cast<uint32_t>(c.Int("marginC", 0, 100, t.margin_c));
      c.Finish();
    }
    {
      ConfigMap c = g.Section("powerViolation");
      t.power_violation = c.Bool("enabled", t.power_violation);
      t.power_violation_percent = c.Double("percent", 0.01, 100.0, t.power_violation_percent);
      t.power_violation_window =
          c.Duration("window", std::chrono::minutes(1), std::chrono::hours(24), t.power_violation_window);
      c.Finish();
    }
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("host");
    config.intervals[5] = Group(g, config.intervals[5]);
    config.host.persistence_mode_off = Switch(g, "persistenceModeOff", config.host.persistence_mode_off);
    // The host services follow the group's switch: `host: {enabled: false}` turns off every host check.
    auto& services = config.host_services;
    auto unit = [&](std::string_view key, bool& on, std::string& name) {
      ConfigMap c = g.Section(key);
      on = c.Bool("enabled", on) && config.intervals[5].count() != 0;
      const std::string fallback = name;
      name = c.String("unit", fallback);
      if (name.empty()) c.Fail("unit", "must name a systemd unit, e.g. " + fallback);
      c.Finish();
    };
    unit("persistencedService", services.persistenced, services.persistenced_unit);
    unit("fabricManagerService", services.fabric_manager, services.fabric_manager_unit);
    services.bus_address = g.String("busAddress", services.bus_address);
    g.Finish();
  }
  {
    ConfigMap g = checks.Section("presence");
    config.presence.gpu_lost = Switch(g, "gpuLost", config.presence.gpu_lost);
    config.presence.missing_from_nvml = Switch(g, "gpuMissingFromNvml", config.presence.missing_from_nvml);
    g.Finish();
  }
  checks.Finish();
  return config;
}

}  // namespace gns::gpu_health
