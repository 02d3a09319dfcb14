// Metrics registry rendering and lifetime.
#include "loop/metrics_registry.hpp"
#include "support/prometheus.hpp"

#include <gtest/gtest.h>

namespace gns {
namespace {

TEST(MetricsRegistry, RendersValidExpositionText) {
  MetricsRegistry registry;
  registry.Counter("gpu_node_supervisor_things_total", "Things", {{"kind", "a"}}).Inc(3);
  registry.Counter("gpu_node_supervisor_things_total", "Things", {{"kind", "b\"q\\\n"}}).Inc();
  registry.Gauge("gpu_node_supervisor_temperature", "Temp").Set(21.5);
  auto handle = registry.AddCollector([](MetricsWriter& w) {
    w.Sample("gpu_node_supervisor_live", MetricType::kGauge, "Live", {{"x", "1"}}, 1);
    w.Sample("gpu_node_supervisor_live", MetricType::kGauge, "Live", {{"x", "2"}}, 2);
  });
  const auto scrape = test::ParsePrometheus(registry.Render());
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_things_total{kind=\"a\"}"), 3);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_things_total{kind=\"b\\\"q\\\\\\n\"}"), 1);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_temperature"), 21.5);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_live{x=\"2\"}"), 2);
  EXPECT_EQ(scrape.types.at("gpu_node_supervisor_things_total"), "counter");

  handle.Reset();
  EXPECT_EQ(registry.Render().find("gpu_node_supervisor_live"), std::string::npos);
}

TEST(MetricsRegistry, SameNameAndLabelsIsTheSameSeriesAndRemovalForgetsIt) {
  MetricsRegistry registry;
  auto& a = registry.Gauge("gpu_node_supervisor_domains", "D", {{"domain", "x"}});
  auto& b = registry.Gauge("gpu_node_supervisor_domains", "D", {{"domain", "x"}});
  EXPECT_EQ(&a, &b);
  registry.Gauge("gpu_node_supervisor_domains", "D", {{"domain", "y"}}).Set(1);
  registry.RemoveMatching("gpu_node_supervisor_domains", {"domain", "x"});
  const auto text = registry.Render();
  EXPECT_EQ(text.find("domain=\"x\""), std::string::npos);
  EXPECT_NE(text.find("domain=\"y\""), std::string::npos);
}

TEST(MetricsRegistry, RejectsNamesWithoutThePrefixAndTypeClashes) {
  MetricsRegistry registry;
  EXPECT_THROW(registry.Counter("other_total", "x"), std::logic_error);
  registry.Counter("gpu_node_supervisor_x", "x");
  EXPECT_THROW(registry.Gauge("gpu_node_supervisor_x", "x"), std::logic_error);
}

}  // namespace
}  // namespace gns
