#pragma once
// The process-wide metrics registry (loop thread only). Modules own counters, gauges and
// histograms by name + labels, or add a collector that writes samples at scrape time (for values
// that are cheaper to read than to track). Rendered in the Prometheus text exposition format 0.0.4.
//
// Names keep to what `promtool check metrics` expects (issue 29): snake_case, counters and only
// counters end in _total, base units (seconds, bytes; never _ms), no _sum/_count/_bucket names
// outside a histogram. A name that breaks a rule is a bug: registering it throws
// std::logic_error (MetricNameProblem says which rule), as a name without kPrefix does.
//
// Every name we own starts with kPrefix. The one deliberate exception is a *foreign family*:
// exposition text under another exporter's names that dashboards already query (dcgm-exporter's
// DCGM_FI_* for the per-pod GPU series, issue 27). It is added with AddForeignFamilies under a
// prefix of its own (never kPrefix, never empty), as pre-rendered text: the owner renders it
// when its data changes, so a scrape only copies it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

// Why `name` is not a name promtool's lint accepts for a family of `type`; empty when it is.
// The rules of promtool 2.42 (client_golang's promlint) that a name can break.
std::string MetricNameProblem(std::string_view name, MetricType type);

// Writes samples at scrape time (counters and gauges).
class MetricsWriter {
 public:
  virtual ~MetricsWriter() = default;
  virtual void Sample(std::string_view family, MetricType type, std::string_view help,
                      const MetricLabels& labels, double value) = 0;
};

class MetricsRegistry {
 public:
  static constexpr std::string_view kPrefix = "gpu_node_supervisor_";

  class Series {
   public:
    void Inc(double delta = 1.0) { value_ += delta; }
    void Set(double value) { value_ = value; }
    double Value() const { return value_; }

   private:
    double value_ = 0.0;
  };

  // Observations counted into buckets by upper bound, with their sum and count: one histogram
  // family, rendered as <name>_bucket{…,le="…"} (cumulative, +Inf last), <name>_sum, <name>_count.
  class HistogramSeries {
   public:
    explicit HistogramSeries(std::span<const double> bounds) : bounds_(bounds), buckets_(bounds.size() + 1, 0) {}
    void Observe(double value);
    double Sum() const { return sum_; }
    uint64_t Count() const { return count_; }
    std::span<const double> Bounds() const { return bounds_; }
    // Observations <= Bounds()[i]; i == Bounds().size() is +Inf (all of them).
    uint64_t CumulativeCount(std::size_t i) const;

   private:
    std::span<const double> bounds_;  // the family's, which outlives its series
    std::vector<uint64_t> buckets_;   // per bucket, not cumulative; the last is above every bound
    double sum_ = 0.0;
    uint64_t count_ = 0;
  };

  // A stable reference to the series (name must carry kPrefix and pass MetricNameProblem).
  // Repeated calls with the same name and labels return the same series.
  Series& Counter(std::string_view name, std::string_view help, MetricLabels labels = {});
  Series& Gauge(std::string_view name, std::string_view help, MetricLabels labels = {});
  // `bounds`: ascending, finite upper bounds (+Inf is implied), the same on every call for a name.
  HistogramSeries& Histogram(std::string_view name, std::string_view help, std::span<const double> bounds,
                             MetricLabels labels = {});
  // Forgets one series (e.g. a deleted ComputeDomain's), or every series of a family whose
  // labels contain `match`.
  void Remove(std::string_view name, const MetricLabels& labels);
  void RemoveMatching(std::string_view name, const std::pair<std::string, std::string>& match);

  class [[nodiscard]] CollectorHandle {
   public:
    CollectorHandle() = default;
    CollectorHandle(MetricsRegistry* registry, uint64_t id) : registry_(registry), id_(id) {}
    ~CollectorHandle() { Reset(); }
    CollectorHandle(CollectorHandle&& o) noexcept : registry_(std::exchange(o.registry_, nullptr)), id_(o.id_) {}
    CollectorHandle& operator=(CollectorHandle&& o) noexcept {
      if (this != &o) {
        Reset();
        registry_ = std::exchange(o.registry_, nullptr);
        id_ = o.id_;
      }
      return *this;
    }
    void Reset();

   private:
    MetricsRegistry* registry_ = nullptr;
    uint64_t id_ = 0;
  };
  CollectorHandle AddCollector(std::function<void(MetricsWriter&)> collect);

  // Appends complete families (# HELP, # TYPE, samples) whose names all start with
  // `name_prefix` to every Render, after ours. `name_prefix` must be a valid metric name start,
  // and must not start with kPrefix (throws std::logic_error otherwise); a debug build checks
  // at render time that every line of the text keeps to it.
  CollectorHandle AddForeignFamilies(std::string_view name_prefix, std::function<void(std::string& out)> append);

  // The whole exposition text.
  std::string Render() const;
  // Only the foreign families added under `name_prefix` (a listener of their own).
  std::string RenderForeign(std::string_view name_prefix) const;

 private:
  struct Family {
    MetricType type;
    std::string help;
    std::map<MetricLabels, std::unique_ptr<Series>> series;
    std::vector<double> bounds;  // histograms only
    std::map<MetricLabels, std::unique_ptr<HistogramSeries>> histograms;
  };
  Family& GetFamily(std::string_view name, MetricType type, std::string_view help);
  Series& GetSeries(std::string_view name, MetricType type, std::string_view help, MetricLabels labels);

  std::map<std::string, Family, std::less<>> families_;
  struct Foreign {
    std::string name_prefix;
    std::function<void(std::string&)> append;
  };
  void AppendForeign(std::string& out, const Foreign& foreign) const;

  std::map<uint64_t, std::function<void(MetricsWriter&)>> collectors_;
  std::map<uint64_t, Foreign> foreign_;
  uint64_t next_collector_ = 1;
};

// Prometheus label-value escaping (backslash, quote, newline).
std::string EscapeLabelValue(std::string_view value);

}  // namespace gns
