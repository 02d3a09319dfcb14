// Metrics registry and Prometheus text rendering.
#include "loop/metrics_registry.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace gns {

namespace {

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

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
#ifndef NDEBUG
    // A collector's names are checked where they are rendered (a bug: debug builds and tests).
    if (type == MetricType::kHistogram) throw std::logic_error("collectors write counters and gauges only");
    if (auto problem = MetricNameProblem(family, type); !problem.empty()) {
      throw std::logic_error("metric " + std::string(family) + ": " + problem);
    }
#endif
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

std::string MetricNameProblem(std::string_view name, MetricType type) {
  if (name.empty()) return "an empty name";
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9'))) {
      return "names are snake_case: [a-z_][a-z0-9_]*";
    }
  }
  if (type == MetricType::kCounter && !name.ends_with("_total")) return "counter names end in _total";
  if (type != MetricType::kCounter && name.ends_with("_total")) return "only counter names end in _total";
  for (std::string_view suffix : {"_sum", "_count", "_bucket"}) {
    if (name.ends_with(suffix)) {
      return "a name ending in " + std::string(suffix) + " is a histogram's sample, not a family (use Histogram)";
    }
  }
  // Name tokens that promlint rejects: an abbreviated unit, a prefixed or non-base unit, the type.
  static constexpr std::string_view kAbbreviations[] = {"s",  "ms", "us", "ns", "sec", "b", "kb",
                                                        "mb", "gb", "tb", "pb", "m",   "h", "d"};
  static constexpr std::string_view kBaseUnits[] = {"amperes", "bytes",  "celsius", "grams",   "joules",
                                                    "kelvin",  "meters", "metres",  "seconds", "volts"};
  static constexpr std::string_view kPrefixes[] = {"pico", "nano", "micro", "milli", "centi", "deci",
                                                   "deca", "hecto", "kilo", "kila", "mega",  "giga",
                                                   "tera", "peta", "exa",  "zetta", "yotta"};
  static constexpr std::pair<std::string_view, std::string_view> kNonBaseUnits[] = {
      {"minutes", "seconds"}, {"hours", "seconds"},  {"days", "seconds"},       {"weeks", "seconds"},
      {"bits", "bytes"},      {"kelvins", "kelvin"}, {"fahrenheit", "celsius"}, {"calories", "joules"}};
  std::string_view rest = name;
  while (true) {
    const std::size_t end = rest.find('_');
    const std::string_view token = rest.substr(0, end);
    if (std::find(std::begin(kAbbreviations), std::end(kAbbreviations), token) != std::end(kAbbreviations)) {
      return "the abbreviated unit \"" + std::string(token) + "\" (use base units: seconds, bytes)";
    }
    for (auto unit : kBaseUnits) {
      for (auto prefix : kPrefixes) {
        if (token.size() == prefix.size() + unit.size() && token.starts_with(prefix) && token.ends_with(unit)) {
          return "the unit " + std::string(token) + " (use the base unit " + std::string(unit) + ")";
        }
      }
    }
    for (const auto& [unit, base] : kNonBaseUnits) {
      if (token == unit) return "the unit " + std::string(token) + " (use the base unit " + std::string(base) + ")";
    }
    if (token == TypeName(type)) return "the name includes its type, " + std::string(token);
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return {};
}

void MetricsRegistry::HistogramSeries::Observe(double value) {
  if (std::isnan(value)) return;  // not an observation; it would turn the sum into NaN for good
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++buckets_[static_cast<std::size_t>(bucket)];
  sum_ += value;
  ++count_;
}

uint64_t MetricsRegistry::HistogramSeries::CumulativeCount(std::size_t i) const {
  uint64_t total = 0;
  for (std::size_t b = 0; b <= i && b < buckets_.size(); ++b) total += buckets_[b];
  return total;
}

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

MetricsRegistry::Family& MetricsRegistry::GetFamily(std::string_view name, MetricType type, std::string_view help) {
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.type != type) throw std::logic_error("metric " + std::string(name) + " registered with two types");
    // A test may look a series up with an empty help before its module registers it.
    if (it->second.help.empty()) it->second.help = std::string(help);
    return it->second;
  }
  if (!name.starts_with(kPrefix)) {
    throw std::logic_error("metric name must start with gpu_node_supervisor_: " + std::string(name));
  }
  if (auto problem = MetricNameProblem(name, type); !problem.empty()) {
    throw std::logic_error("metric " + std::string(name) + ": " + problem);
  }
  return families_.emplace(std::string(name), Family{type, std::string(help), {}, {}, {}}).first->second;
}

MetricsRegistry::Series& MetricsRegistry::GetSeries(std::string_view name, MetricType type,
                                                    std::string_view help, MetricLabels labels) {
  auto& slot = GetFamily(name, type, help).series[std::move(labels)];
  if (!slot) slot = std::make_unique<Series>();
  return *slot;
}

MetricsRegistry::HistogramSeries& MetricsRegistry::Histogram(std::string_view name, std::string_view help,
                                                             std::span<const double> bounds, MetricLabels labels) {
  const bool ascending = std::adjacent_find(bounds.begin(), bounds.end(), std::greater_equal<>()) == bounds.end();
  const bool finite = std::all_of(bounds.begin(), bounds.end(), [](double b) { return std::isfinite(b); });
  if (bounds.empty() || !ascending || !finite) {
    throw std::logic_error("histogram " + std::string(name) + ": bounds must be finite, ascending and not empty");
  }
  for (const auto& [label, value] : labels) {
    if (label == "le") throw std::logic_error("histogram " + std::string(name) + ": the label le is its buckets'");
  }
  auto& family = GetFamily(name, MetricType::kHistogram, help);
  if (family.bounds.empty()) {
    family.bounds.assign(bounds.begin(), bounds.end());
  } else if (!std::equal(family.bounds.begin(), family.bounds.end(), bounds.begin(), bounds.end())) {
    throw std::logic_error("histogram " + std::string(name) + " registered with two sets of bounds");
  }
  auto& slot = family.histograms[std::move(labels)];
  if (!slot) slot = std::make_unique<HistogramSeries>(family.bounds);
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
  if (it == families_.end()) return;
  it->second.series.erase(labels);
  it->second.histograms.erase(labels);
}

void MetricsRegistry::RemoveMatching(std::string_view name, const std::pair<std::string, std::string>& match) {
  const auto it = families_.find(name);
  if (it == families_.end()) return;
  auto matches = [&](const auto& entry) {
    for (const auto& label : entry.first)
      if (label == match) return true;
    return false;
  };
  std::erase_if(it->second.series, matches);
  std::erase_if(it->second.histograms, matches);
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
  std::string sample_name;
  for (const auto& [name, family] : families_) {
    if (family.series.empty() && family.histograms.empty()) continue;
    emit_header(name, family.type, family.help);
    for (const auto& [labels, series] : family.series) emit_sample(name, labels, series->Value());
    for (const auto& [labels, histogram] : family.histograms) {
      sample_name.assign(name).append("_bucket");
      MetricLabels with_le = labels;
      with_le.emplace_back("le", "");
      for (std::size_t i = 0; i <= family.bounds.size(); ++i) {
        std::string& le = with_le.back().second;
        le.clear();
        if (i < family.bounds.size()) {
          AppendValue(le, family.bounds[i]);
        } else {
          le = "+Inf";
        }
        emit_sample(sample_name, with_le, static_cast<double>(histogram->CumulativeCount(i)));
      }
      emit_sample(sample_name.assign(name).append("_sum"), labels, histogram->Sum());
      emit_sample(sample_name.assign(name).append("_count"), labels, static_cast<double>(histogram->Count()));
    }
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
