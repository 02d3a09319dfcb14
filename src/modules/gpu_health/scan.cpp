// gpu-health's checks judged once for the `scan` subcommand (api/scan.hpp).
#include "modules/gpu_health/api/scan.hpp"

#include "modules/gpu_health/health_checks.hpp"
#include "modules/gpu_health/host_services.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace gns::gpu_health {
namespace {

ScanFinding FromFinding(const Finding& finding) {
  ScanFinding out;
  out.check = finding.check;
  if (!finding.holds) return out;
  const Condition& c = *finding.holds;
  out.holds = true;
  out.severity = std::string(SeverityName(c.severity));
  out.component = std::string(ComponentName(c.component));
  out.action = std::string(ActionName(c.action));
  out.message = c.message;
  return out;
}

bool MakesUnhealthy(const ScanFinding& f) { return f.holds && f.severity != SeverityName(Severity::kWarning); }

nlohmann::json FindingJson(const ScanFinding& f) {
  nlohmann::json j = {{"check", f.check}, {"holds", f.holds}};
  if (!f.judged) {
    j["judged"] = false;
    j["message"] = f.message;
  }
  if (f.holds) {
    j["severity"] = f.severity;
    j["component"] = f.component;
    j["recommendedAction"] = f.action;
    j["message"] = f.message;
  }
  return j;
}

}  // namespace

ScanReport Scan(const gpu_inventory::HealthSample& sample, std::size_t known_gpus,
                const gpu_inventory::HealthSample* previous) {
  ScanReport report;
  report.ok = sample.ok;
  report.error = sample.error;
  report.pass_micros = sample.pass_micros;
  report.pci_gpu_count = sample.pci_gpu_count;
  if (!sample.ok) return report;
  HealthChecks checks{ChecksConfig{}};
  if (previous != nullptr && previous->ok) (void)checks.Judge(*previous, known_gpus);
  const HealthChecks::PassFindings pass = checks.Judge(sample, known_gpus);
  report.healthy = true;
  for (const auto& gpu : pass.gpus) {
    ScanGpu out;
    out.uuid = gpu.uuid;
    out.pci = gpu.pci;
    const auto reading = std::find_if(sample.gpus.begin(), sample.gpus.end(),
                                      [&](const gpu_inventory::GpuHealthReading& r) { return r.uuid == gpu.uuid; });
    if (reading != sample.gpus.end()) {
      out.index = reading->index;
      out.failed_functions = reading->failed_functions;
    }
    for (const Finding& f : gpu.findings) {
      out.findings.push_back(FromFinding(f));
      if (MakesUnhealthy(out.findings.back())) out.healthy = false;
    }
    report.healthy = report.healthy && out.healthy;
    report.gpus.push_back(std::move(out));
  }
  if (pass.node) {
    report.node = FromFinding(*pass.node);
    if (MakesUnhealthy(*report.node)) report.healthy = false;
  }
  return report;
}

void ScanHostServices(ScanReport& report, const std::function<imex_health::UnitState(const std::string& unit)>& read) {
  for (const HostService& service : HostServices(HostServicesSettings{})) {
    const imex_health::UnitState unit = read(service.unit);
    const std::optional<Finding> finding = JudgeHostService(service, unit);
    if (!finding) {
      ScanFinding skipped;
      skipped.check = service.check;
      skipped.judged = false;
      skipped.message = service.unit + " " +
                        (unit.known ? "is " + unit.active_state + " (" + unit.sub_state + ")" : "not read: " + unit.error);
      report.services.push_back(std::move(skipped));
      continue;
    }
    report.services.push_back(FromFinding(*finding));
    if (MakesUnhealthy(report.services.back())) report.healthy = false;
  }
}

nlohmann::json ToJson(const ScanReport& report) {
  nlohmann::json j = {{"ok", report.ok}, {"healthy", report.healthy}, {"passMicros", report.pass_micros}};
  if (!report.ok) j["error"] = report.error;
  if (report.pci_gpu_count) j["pciGpuCount"] = *report.pci_gpu_count;
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& gpu : report.gpus) {
    nlohmann::json findings = nlohmann::json::array();
    for (const auto& f : gpu.findings) findings.push_back(FindingJson(f));
    nlohmann::json g = {{"index", gpu.index}, {"uuid", gpu.uuid},         {"pci", gpu.pci},
                        {"healthy", gpu.healthy}, {"findings", findings}};
    if (!gpu.failed_functions.empty()) g["failedFunctions"] = gpu.failed_functions;
    gpus.push_back(std::move(g));
  }
  j["gpus"] = std::move(gpus);
  if (report.node) j["node"] = FindingJson(*report.node);
  nlohmann::json services = nlohmann::json::array();
  for (const auto& f : report.services) services.push_back(FindingJson(f));
  j["services"] = std::move(services);
  return j;
}

std::string ToTable(const ScanReport& report) {
  std::ostringstream out;
  if (!report.ok) {
    out << "NVML health read failed: " << report.error << "\n";
    return out.str();
  }
  // The first column is as wide as its longest entry: "GPU <index> <uuid> <pci>" is 63
  // characters for a real GPU, so a fixed width ran the PCI address into the check's name.
  auto describe = [](const ScanGpu& gpu) { return "GPU " + std::to_string(gpu.index) + " " + gpu.uuid + " " + gpu.pci; };
  std::size_t who_width = std::string_view("node").size();
  for (const auto& gpu : report.gpus) who_width = std::max(who_width, describe(gpu).size());
  auto row = [&](const std::string& who, const ScanFinding& f) {
    out << std::left << std::setw(static_cast<int>(who_width + 2)) << who << std::setw(26) << f.check;
    if (!f.judged) {
      out << "not judged: " << f.message << "\n";
      return;
    }
    if (!f.holds) {
      out << "ok\n";
      return;
    }
    out << (MakesUnhealthy(f) ? "FAIL " : "WARN ") << f.severity << " " << f.action << ": " << f.message << "\n";
  };
  for (const auto& gpu : report.gpus) {
    const std::string who = describe(gpu);
    if (gpu.findings.empty()) out << who << "  (nothing NVML could give was judged)\n";
    for (const auto& f : gpu.findings) row(who, f);
    if (!gpu.failed_functions.empty()) {
      out << who << "  NVML calls that failed:";
      for (const auto& fn : gpu.failed_functions) out << " " << fn;
      out << "\n";
    }
  }
  if (report.node) row("node", *report.node);
  for (const auto& f : report.services) row("node", f);
  out << report.gpus.size() << " GPU(s)";
  if (report.pci_gpu_count) out << ", " << *report.pci_gpu_count << " NVIDIA GPU(s) on the PCI bus";
  out << "; one pass in " << report.pass_micros << " us: " << (report.healthy ? "healthy" : "UNHEALTHY") << "\n";
  return out.str();
}

}  // namespace gns::gpu_health
