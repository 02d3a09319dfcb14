// Metrics registry and Prometheus text rendering.
#include "loop/metrics_registry.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace gns {

namespace {

std::string_view TypeName(MetricType type) { return type == MetricType::kCounter ? "counter" : "gauge"; }

void AppendValue(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    out += std::to_string(static_cast<long long>(value));
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.9g", value);
    out += buf;
  }
}

void AppendLabels(std::string& out, const MetricLabels& labels) {
  if (labels.empty()) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += EscapeLabelValue(v);
    out += '"';
  }
  out += '}';
}

void AppendHelp(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
}

// Collects scrape-time samples grouped by family, so HELP/TYPE appear once per family.
class GroupingWriter final : public MetricsWriter {
 public:
  struct Group {
    MetricType type;
    std::string help;
    std::vector<std::pair<MetricLabels, double>> samples;
  };
  void Sample(std::string_view family, MetricType type, std::string_view help, const MetricLabels& labels,
              double value) override {
    auto& group = groups[std::string(family)];
    if (group.samples.empty()) {
      group.type = type;
      group.help = std::string(help);
    }
    group.samples.emplace_back(labels, value);
  }
  std::map<std::string, Group> groups;
};

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

MetricsRegistry::Series& MetricsRegistry::GetSeries(std::string_view name, MetricType type,
                                                    std::string_view help, MetricLabels labels) {
  if (!name.starts_with(kPrefix)) {
    throw std::logic_error("metric name must start with gpu_node_supervisor_: " + std::string(name));
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(std::string(name), Family{type, std::string(help), {}}).first;
  } else if (it->second.type != type) {
    throw std::logic_error("metric " + std::string(name) + " registered with two types");
  }
  auto& slot = it->second.series[std::move(labels)];
  if (!slot) slot = std::make_unique<Series>();
  return *slot;
}

MetricsRegistry::Series& MetricsRegistry::Counter(std::string_view name, std::string_view help, MetricLabels labels) {
  return GetSeries(name, MetricType::kCounter, help, std::move(labels));
}

MetricsRegistry::Series& MetricsRegistry::Gauge(std::string_view name, std::string_view help, MetricLabels labels) {
  return GetSeries(name, MetricType::kGauge, help, std::move(labels));
}

void MetricsRegistry::Remove(std::string_view name, const MetricLabels& labels) {
  const auto it = families_.find(name);
  if (it != families_.end()) it->second.series.erase(labels);
}

void MetricsRegistry::RemoveMatching(std::string_view name, const std::pair<std::string, std::string>& match) {
  const auto it = families_.find(name);
  if (it == families_.end()) return;
  std::erase_if(it->second.series, [&](const auto& entry) {
    for (const auto& label : entry.first)
      if (label == match) return true;
    return false;
  });
}

void MetricsRegistry::CollectorHandle::Reset() {
  if (registry_ != nullptr) {
    registry_->collectors_.erase(id_);
    registry_->foreign_.erase(id_);
  }
  registry_ = nullptr;
}

MetricsRegistry::CollectorHandle MetricsRegistry::AddCollector(std::function<void(MetricsWriter&)> collect) {
  const uint64_t id = next_collector_++;
  collectors_.emplace(id, std::move(collect));
  return CollectorHandle(this, id);
}

MetricsRegistry::CollectorHandle MetricsRegistry::AddForeignFamilies(std::string_view name_prefix,
                                                                     std::function<void(std::string&)> append) {
  auto name_char = [](char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
  };
  bool valid = !name_prefix.empty();
  for (std::size_t i = 0; valid && i < name_prefix.size(); ++i) valid = name_char(name_prefix[i], i == 0);
  if (!valid || name_prefix.starts_with(kPrefix) || kPrefix.starts_with(name_prefix)) {
    throw std::logic_error("foreign metric families need a name prefix of their own, not \"" + std::string(name_prefix) +
                           "\"");
  }
  const uint64_t id = next_collector_++;
  foreign_.emplace(id, Foreign{std::string(name_prefix), std::move(append)});
  return CollectorHandle(this, id);
}

void MetricsRegistry::AppendForeign(std::string& out, const Foreign& foreign) const {
  [[maybe_unused]] const std::size_t start = out.size();
  foreign.append(out);
#ifndef NDEBUG
  // Every sample and comment line names a family under the prefix (a bug otherwise).
  std::string_view text = std::string_view(out).substr(start);
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) line.remove_prefix(7);
    if (!line.empty() && !line.starts_with(foreign.name_prefix)) {
      throw std::logic_error("foreign metric line outside " + foreign.name_prefix + ": " + std::string(line));
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
#endif
}

std::string MetricsRegistry::RenderForeign(std::string_view name_prefix) const {
  std::string out;
  for (const auto& [id, foreign] : foreign_) {
    if (foreign.name_prefix == name_prefix) AppendForeign(out, foreign);
  }
  return out;
}

std::string MetricsRegistry::Render() const {
  GroupingWriter writer;
  for (const auto& [id, collect] : collectors_) collect(writer);

  std::string out;
  out.reserve(4096);
  auto emit_header = [&out](std::string_view name, MetricType type, std::string_view help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    AppendHelp(out, help);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += TypeName(type);
    out += '\n';
  };
  auto emit_sample = [&out](std::string_view name, const MetricLabels& labels, double value) {
    out += name;
    AppendLabels(out, labels);
    out += ' ';
    AppendValue(out, value);
    out += '\n';
  };
  for (const auto& [name, family] : families_) {
    if (family.series.empty()) continue;
    emit_header(name, family.type, family.help);
    for (const auto& [labels, series] : family.series) emit_sample(name, labels, series->Value());
  }
  for (const auto& [name, group] : writer.groups) {
    if (families_.count(name) != 0) continue;  // a family is owned by one side only
    emit_header(name, group.type, group.help);
    for (const auto& [labels, value] : group.samples) emit_sample(name, labels, value);
  }
  for (const auto& [id, foreign] : foreign_) AppendForeign(out, foreign);
  return out;
}

}  // namespace gns
