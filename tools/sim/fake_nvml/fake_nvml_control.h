// In-process control entry points of the fake libnvidia-ml.so.1 (tools/sim/fake_nvml). Tests
// that dlopen the fake resolve these with dlsym (the typedefs below) next to the NVML symbols;
// out-of-process users send the same commands over the FAKE_NVML_CONTROL datagram socket
// (see README.md here and fakenvmlctl.py).
//
// Every function returns an NVML return code (0 = success).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// The library is built with hidden visibility; these are its only non-NVML exports.
#define FAKE_NVML_CONTROL_API __attribute__((visibility("default")))

// Queues an Xid critical-error event (eventData = xid) on every event set that registered
// nvmlEventTypeXidCriticalError for the GPU named by `uuid` (a UUID or a PCI bus id), waking
// waiters. Events for GPUs nobody registered are dropped, as on real hardware.
// Returns NVML_ERROR_UNINITIALIZED before nvmlInit, NVML_ERROR_NOT_FOUND for an unknown GPU.
FAKE_NVML_CONTROL_API int fakeNvmlInjectXid(const char* uuid, unsigned long long xid);

// Makes the NVML function `function_name` (its exported name, e.g. "nvmlDeviceGetUUID" or
// "nvmlEventSetWait_v2") return `nvml_return` until cleared; "*" makes every NVML function
// fail (a specific entry wins over "*"). Waiters blocked in nvmlEventSetWait_v2 wake and return
// the code. Returns NVML_ERROR_INVALID_ARGUMENT for a name the fake does not export.
FAKE_NVML_CONTROL_API int fakeNvmlSetFailure(const char* function_name, int nvml_return);

// Removes every injected failure.
FAKE_NVML_CONTROL_API int fakeNvmlClearFailures(void);

typedef int (*fakeNvmlInjectXid_t)(const char*, unsigned long long);
typedef int (*fakeNvmlSetFailure_t)(const char*, int);
typedef int (*fakeNvmlClearFailures_t)(void);

#ifdef __cplusplus
}  // extern "C"
#endif
