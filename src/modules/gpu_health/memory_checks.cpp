// Memory checks (see memory_checks.hpp).
#include "modules/gpu_health/memory_checks.hpp"

namespace gns::gpu_health {

Findings MemoryChecks::Judge(const gpu_inventory::GpuHealthReading& gpu, int64_t at_ms) {
  Findings out;
  const std::string who = GpuName(gpu);
  auto add = [&out](std::string_view check, bool holds, Severity severity, RecommendedAction action,
                    std::string message, std::string_view code) {
    Finding f{std::string(check), std::nullopt};
    if (holds) f.holds = Condition{std::string(check), Component::kMemory, severity, action, std::move(message), std::string(code)};
    out.push_back(std::move(f));
  };
  if (const auto& rows = gpu.remapped_rows) {
    const std::string counts = " (" + std::to_string(rows->uncorrected) + " rows remapped for uncorrectable errors, " +
                               std::to_string(rows->corrected) + " for correctable ones)";
    // gpud's remapped-rows: a failed remap means the memory has no spare row left where it
    // needs one — hardware inspection (NVSentinel: CONTACT_SUPPORT). A reset does not help.
    if (settings_.row_remap_failed) {
      add("RowRemapFailed", rows->failed, Severity::kFatal, RecommendedAction::kContactSupport,
          who + ": a row remap failed" + counts + "; the GPU needs hardware inspection", "DCGM_FR_ROW_REMAP_FAILURE");
    }
    // A pending remap takes effect at the next GPU reset (NVSentinel: COMPONENT_RESET); until
    // then the faulty row is still in use.
    if (settings_.row_remap_pending) {
      add("RowRemapPending", rows->pending, Severity::kFatal, RecommendedAction::kComponentReset,
          who + ": a row remap is pending" + counts + "; a GPU reset applies it", "DCGM_FR_PENDING_ROW_REMAP");
    }
  }
  if (const auto& histogram = gpu.remap_histogram; histogram && settings_.row_remap_spares_exhausted) {
    // Banks with no spare row left: the next uncorrectable error there fails its remap. Not a
    // fault yet; said so the operator can plan the replacement.
    add("RowRemapSparesExhausted", histogram->none > 0, Severity::kWarning, RecommendedAction::kNone,
        who + ": " + std::to_string(histogram->none) + " memory bank(s) have no spare row left", "");
  }
  if (const auto& pages = gpu.retired_pages) {
    if (settings_.retired_pages_pending) {
      add("RetiredPagesPending", pages->pending, Severity::kFatal, RecommendedAction::kComponentReset,
          who + ": a page retirement is pending (" + std::to_string(pages->double_bit) + " pages retired for DBEs, " +
              std::to_string(pages->single_bit) + " for SBEs); a GPU reset applies it",
          "DCGM_FR_PENDING_PAGE_RETIREMENTS");
    }
    if (settings_.retired_pages_limit) {
      // A lifetime aggregate: DCGM judges the total against a limit, not a rate.
      const uint64_t total = uint64_t{pages->single_bit} + pages->double_bit;
      add("RetiredPagesLimit", total >= settings_.retired_pages_max, Severity::kFatal,
          RecommendedAction::kContactSupport,
          who + ": " + std::to_string(total) + " pages retired over the GPU's life (limit " +
              std::to_string(settings_.retired_pages_max) + ")",
          "DCGM_FR_RETIRED_PAGES_LIMIT");
    }
  }
  State& state = gpus_[gpu.uuid];
  if (const auto dbe = gpu.ecc.uncorrected_volatile; dbe && settings_.ecc_uncorrectable_volatile) {
    // Growth, not the value: the counter is cumulative since the driver loaded, and a DBE
    // before this process started was an XID 48 the XID judge saw. The first reading is the
    // baseline (no judgement).
    if (state.uncorrected_volatile && *dbe >= *state.uncorrected_volatile) {
      const uint64_t grew = *dbe - *state.uncorrected_volatile;
      add("EccUncorrectableVolatile", grew > 0, Severity::kFatal, RecommendedAction::kComponentReset,
          who + ": " + std::to_string(grew) + " new uncorrectable (double-bit) ECC error(s), " + std::to_string(*dbe) +
              " since the driver loaded",
          "DCGM_FR_VOLATILE_DBE_DETECTED");
    }
    state.uncorrected_volatile = dbe;
  }
  if (const auto sbe = gpu.ecc.corrected_volatile; sbe && settings_.ecc_correctable_rate.enabled) {
    const auto& rate = settings_.ecc_correctable_rate;
    const uint64_t grew = state.corrected.Add(*sbe, at_ms, rate.window);
    add("EccCorrectableRate", static_cast<double>(grew) >= rate.Threshold(), Severity::kWarning,
        RecommendedAction::kNone,
        who + ": " + std::to_string(grew) + " correctable (single-bit) ECC errors within " +
            std::to_string(rate.window.count() / 1000) + " s",
        "DCGM_FR_SBE_VIOLATION");
  }
  return out;
}

}  // namespace gns::gpu_health
