#!/usr/bin/env python3
"""Read-only probe of the NVML calls gpu-health's checks use (issue 26), on a real GPU.

For every GPU: each call's return code (by NVML's name) and value, and how long it took, so
the fake NVML's answers and the checks' "no reading" cases can be compared with a real driver.
It never changes anything on the GPU (no set, no reset, no clear).

  tools/nvml-health-probe.py [--library libnvidia-ml.so.1] > probe.json
"""
import argparse
import ctypes as C
import json
import os
import time

RETURN_NAMES = {
    0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED",
    4: "NO_PERMISSION", 5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER", 9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND", 13: "FUNCTION_NOT_FOUND", 14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST", 16: "RESET_REQUIRED", 17: "OPERATING_SYSTEM", 18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE", 20: "MEMORY", 21: "NO_DATA", 22: "VGPU_ECC_NOT_ENABLED",
    23: "INSUFFICIENT_RESOURCES", 24: "FREQ_NOT_SUPPORTED", 25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED", 27: "NOT_READY", 28: "GPU_NOT_FOUND", 29: "INVALID_STATE", 999: "UNKNOWN",
}


class FieldValue(C.Structure):
    _fields_ = [("fieldId", C.c_uint), ("scopeId", C.c_uint), ("timestamp", C.c_longlong),
                ("latencyUsec", C.c_longlong), ("valueType", C.c_int), ("nvmlReturn", C.c_int),
                ("value", C.c_ulonglong)]


class Histogram(C.Structure):
    _fields_ = [(n, C.c_uint) for n in ("max", "high", "partial", "low", "none")]


class Violation(C.Structure):
    _fields_ = [("referenceTime", C.c_ulonglong), ("violationTime", C.c_ulonglong)]


class FabricV3(C.Structure):
    _fields_ = [("version", C.c_uint), ("clusterUuid", C.c_ubyte * 16), ("status", C.c_int),
                ("cliqueId", C.c_uint), ("state", C.c_ubyte), ("healthMask", C.c_uint),
                ("healthSummary", C.c_ubyte)]


class PciInfo(C.Structure):  # nvmlPciInfo_t
    _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint),
                ("device", C.c_uint), ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint),
                ("busId", C.c_char * 32)]


class Memory(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


class Utilization(C.Structure):
    _fields_ = [("gpu", C.c_uint), ("memory", C.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", default="libnvidia-ml.so.1")
    args = ap.parse_args()
    nvml = C.CDLL(args.library)
    out = {"library": args.library, "calls": {}, "gpus": []}

    def call(record, name, *argv):
        fn = getattr(nvml, name, None)
        if fn is None:
            record[name] = {"return": "FUNCTION_NOT_FOUND"}
            return None
        t = time.perf_counter()
        rc = fn(*argv)
        us = (time.perf_counter() - t) * 1e6
        record[name] = {"return": RETURN_NAMES.get(rc, rc), "micros": round(us, 1)}
        return rc

    top = out["calls"]
    call(top, "nvmlInit_v2")
    buf = C.create_string_buffer(96)
    if call(top, "nvmlSystemGetDriverVersion", buf, 96) == 0:
        top["nvmlSystemGetDriverVersion"]["value"] = buf.value.decode()
    if call(top, "nvmlSystemGetNVMLVersion", buf, 96) == 0:
        top["nvmlSystemGetNVMLVersion"]["value"] = buf.value.decode()
    count = C.c_uint(0)
    call(top, "nvmlDeviceGetCount_v2", C.byref(count))
    top["count"] = count.value

    pass_started = time.perf_counter()
    for i in range(count.value):
        dev = C.c_void_p()
        g = {"index": i, "calls": {}}
        r = g["calls"]
        if call(r, "nvmlDeviceGetHandleByIndex_v2", i, C.byref(dev)) != 0:
            out["gpus"].append(g)
            continue

        def val(name, ctype, *pre, key=None):
            v = ctype()
            rc = call(r if key is None else r.setdefault(key, {}), name, dev, *pre, C.byref(v))
            rec = (r if key is None else r[key])[name]
            if rc == 0:
                rec["value"] = v.value
            return rc, v.value

        if call(r, "nvmlDeviceGetUUID", dev, buf, 96) == 0:
            g["uuid"] = buf.value.decode()
        if call(r, "nvmlDeviceGetName", dev, buf, 96) == 0:
            g["name"] = buf.value.decode()
        val("nvmlDeviceGetBrand", C.c_uint)  # dra-gpu's `brand` attribute (nvmlBrandType_t)
        cur, pend = C.c_int(), C.c_int()
        if call(r, "nvmlDeviceGetEccMode", dev, C.byref(cur), C.byref(pend)) == 0:
            r["nvmlDeviceGetEccMode"]["value"] = [cur.value, pend.value]
        for etype, ename in ((0, "corrected"), (1, "uncorrected")):
            for ctype_, cname in ((0, "volatile"), (1, "aggregate")):
                val("nvmlDeviceGetTotalEccErrors", C.c_ulonglong, etype, ctype_, key=f"ecc_{ename}_{cname}")
        a, b, c, d = C.c_uint(), C.c_uint(), C.c_uint(), C.c_uint()
        if call(r, "nvmlDeviceGetRemappedRows", dev, C.byref(a), C.byref(b), C.byref(c), C.byref(d)) == 0:
            r["nvmlDeviceGetRemappedRows"]["value"] = {"corrected": a.value, "uncorrected": b.value,
                                                       "pending": c.value, "failed": d.value}
        h = Histogram()
        if call(r, "nvmlDeviceGetRowRemapperHistogram", dev, C.byref(h)) == 0:
            r["nvmlDeviceGetRowRemapperHistogram"]["value"] = {n: getattr(h, n) for n, _ in Histogram._fields_}
        for cause in (0, 1):
            n = C.c_uint(0)
            rc = call(r.setdefault(f"retired_cause{cause}", {}), "nvmlDeviceGetRetiredPages", dev, cause, C.byref(n), None)
            r[f"retired_cause{cause}"]["nvmlDeviceGetRetiredPages"]["count"] = n.value
        val("nvmlDeviceGetRetiredPagesPendingStatus", C.c_int)
        links = []
        for link in range(18):
            st = C.c_int()
            rec = {}
            rc = call(rec, "nvmlDeviceGetNvLinkState", dev, link, C.byref(st))
            entry = {"link": link, "state": rec["nvmlDeviceGetNvLinkState"]["return"]}
            if rc == 0:
                entry["active"] = st.value
                for counter, cname in enumerate(("replay", "recovery", "crc_flit", "crc_data", "ecc_data")):
                    v = C.c_ulonglong()
                    rec2 = {}
                    rc2 = call(rec2, "nvmlDeviceGetNvLinkErrorCounter", dev, link, counter, C.byref(v))
                    entry[cname] = v.value if rc2 == 0 else rec2["nvmlDeviceGetNvLinkErrorCounter"]["return"]
            links.append(entry)
            if rc != 0 and link > 0:
                break
        g["nvlinks"] = links
        # What is at the far end of link 0 (an NVSwitch's PCI address and port on NVLink
        # systems; the SXid -> GPU map is built from these two answers).
        remote = PciInfo()
        if call(r, "nvmlDeviceGetNvLinkRemotePciInfo_v2", dev, 0, C.byref(remote)) == 0:
            r["nvmlDeviceGetNvLinkRemotePciInfo_v2"]["value"] = remote.busId.decode(errors="replace")
        fv_remote = (FieldValue * 1)()
        fv_remote[0].fieldId = 146  # NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID
        fv_remote[0].scopeId = 0
        rec = r.setdefault("remote_nvlink_id_link0", {})
        if call(rec, "nvmlDeviceGetFieldValues", dev, 1, fv_remote) == 0:
            rec["nvmlDeviceGetFieldValues"]["field"] = {
                "return": RETURN_NAMES.get(fv_remote[0].nvmlReturn, fv_remote[0].nvmlReturn),
                "valueType": fv_remote[0].valueType, "value": fv_remote[0].value}
        fab = FabricV3()
        fab.version = C.sizeof(FabricV3) | (3 << 24)
        if call(r, "nvmlDeviceGetGpuFabricInfoV", dev, C.byref(fab)) == 0:
            r["nvmlDeviceGetGpuFabricInfoV"]["value"] = {
                "sizeof": C.sizeof(FabricV3), "state": fab.state, "status": RETURN_NAMES.get(fab.status, fab.status),
                "cliqueId": fab.cliqueId, "healthMask": hex(fab.healthMask), "healthSummary": fab.healthSummary,
                "clusterUuid": bytes(fab.clusterUuid).hex()}
        for name in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                     "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
                     "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetPcieReplayCounter",
                     "nvmlDeviceGetPcieSpeed"):
            val(name, C.c_uint)
        val("nvmlDeviceGetCurrentClocksEventReasons", C.c_ulonglong)
        val("nvmlDeviceGetCurrentClocksThrottleReasons", C.c_ulonglong)
        val("nvmlDeviceGetSupportedClocksEventReasons", C.c_ulonglong)
        val("nvmlDeviceGetTemperature", C.c_uint, 0)
        for t, tname in ((0, "shutdown"), (1, "slowdown"), (2, "mem_max"), (3, "gpu_max")):
            val("nvmlDeviceGetTemperatureThreshold", C.c_uint, t, key=f"threshold_{tname}")
        fv = (FieldValue * 1)()
        fv[0].fieldId = 82  # NVML_FI_DEV_MEMORY_TEMP
        if call(r, "nvmlDeviceGetFieldValues", dev, 1, fv) == 0:
            r["nvmlDeviceGetFieldValues"]["memory_temp"] = {
                "return": RETURN_NAMES.get(fv[0].nvmlReturn, fv[0].nvmlReturn), "valueType": fv[0].valueType,
                "value": fv[0].value}
        for pol, pname in ((0, "power"), (1, "thermal")):
            v = Violation()
            rec = r.setdefault(f"violation_{pname}", {})
            if call(rec, "nvmlDeviceGetViolationStatus", dev, pol, C.byref(v)) == 0:
                rec["nvmlDeviceGetViolationStatus"]["value"] = [v.referenceTime, v.violationTime]
        val("nvmlDeviceGetPersistenceMode", C.c_int)
        val("nvmlDeviceGetSupportedEventTypes", C.c_ulonglong)
        # Telemetry of the dcgm-exporter series (issue 27).
        m = Memory()
        if call(r, "nvmlDeviceGetMemoryInfo", dev, C.byref(m)) == 0:
            r["nvmlDeviceGetMemoryInfo"]["value"] = {"total": m.total, "free": m.free, "used": m.used}
        u = Utilization()
        if call(r, "nvmlDeviceGetUtilizationRates", dev, C.byref(u)) == 0:
            r["nvmlDeviceGetUtilizationRates"]["value"] = {"gpu": u.gpu, "memory": u.memory}
        val("nvmlDeviceGetPowerUsage", C.c_uint)
        val("nvmlDeviceGetTotalEnergyConsumption", C.c_ulonglong)
        val("nvmlDeviceGetClockInfo", C.c_uint, 1, key="clock_sm")
        val("nvmlDeviceGetClockInfo", C.c_uint, 2, key="clock_mem")
        out["gpus"].append(g)
    out["pass_micros"] = round((time.perf_counter() - pass_started) * 1e6, 1)

    pci = []
    base = "/sys/bus/pci/devices"
    for d in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        try:
            vendor = open(f"{base}/{d}/vendor").read().strip()
            klass = open(f"{base}/{d}/class").read().strip()
        except OSError:
            continue
        if vendor == "0x10de":
            pci.append({"address": d, "class": klass})
    out["pci_nvidia_functions"] = pci
    call(top, "nvmlShutdown")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
