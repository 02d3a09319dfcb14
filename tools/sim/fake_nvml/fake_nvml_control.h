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
// Queues an event of `event_type` (one nvmlEventType* bit: nvmlEventTypeSingleBitEccError 0x1,
// DoubleBitEccError 0x2, Clock 0x10, …) with eventData `data` on every event set that
// registered that type for the GPU `uuid` (a UUID or a PCI bus id), in this process and the
// driver's other client processes. Only the event: the counters it announces change with
// fakeNvmlSetHealth. NVML_ERROR_INVALID_ARGUMENT unless exactly one bit is set.
FAKE_NVML_CONTROL_API int fakeNvmlInjectEvent(const char* uuid, unsigned long long event_type, unsigned long long data);
// The event types registered on the GPU `uuid` by every event set of this process and the
// driver's other client processes (OR of their masks; 0 when none). A GPU's
// supportedEventTypes bound what can be registered (nvmlDeviceRegisterEvents answers
// NOT_SUPPORTED for any other type). NVML_ERROR_NOT_FOUND for an unknown GPU.
FAKE_NVML_CONTROL_API int fakeNvmlRegisteredEvents(const char* uuid, unsigned long long* event_types);

// Makes the NVML function `function_name` (its exported name, e.g. "nvmlDeviceGetUUID" or
// "nvmlEventSetWait_v2") return `nvml_return` until cleared; "*" makes every NVML function
// fail (a specific entry wins over "*"). Waiters blocked in nvmlEventSetWait_v2 wake and return
// the code. Returns NVML_ERROR_INVALID_ARGUMENT for a name the fake does not export.
FAKE_NVML_CONTROL_API int fakeNvmlSetFailure(const char* function_name, int nvml_return);

// Removes every injected failure.
FAKE_NVML_CONTROL_API int fakeNvmlClearFailures(void);

// The timeout the latest nvmlEventSetWait_v2 call was given (0 before any), so a test can see
// how its caller paces its waits.
FAKE_NVML_CONTROL_API int fakeNvmlLastWaitTimeout(unsigned int* timeout_ms);

// Reads FAKE_NVML_CONFIG again while NVML stays initialized, as the driver's view changes in a
// MIG reconfiguration: the file must list the same GPUs (UUIDs, in order), so the init
// generation and whole-GPU handles stay valid (MIG handles of a changed GPU go stale). For
// every GPU whose MIG mode or MIG devices changed, queues nvmlEventMigConfigChange (eventData
// 0) on each event set registered for it. `changed_gpus` (may be null) gets how many GPUs
// changed. Returns NVML_ERROR_UNINITIALIZED before nvmlInit, the load error's code for an
// unreadable file, NVML_ERROR_INVALID_ARGUMENT when the GPUs differ (nothing changes then).
FAKE_NVML_CONTROL_API int fakeNvmlReloadConfig(unsigned int* changed_gpus);

// Changes what the health readings of the GPU `uuid` answer, as a fault of the hardware would:
// `json_keys` is a JSON object of the README's health keys (e.g. {"pcieWidth":8,"lost":true},
// or the maintenance keys remapPending, remapFailure, retiredPagesPending, persistence). Kept by
// UUID for the life of the process, over what FAKE_NVML_CONFIG says, and passed on to the
// driver's other client processes. NVML_ERROR_INVALID_ARGUMENT for a bad key or value (nothing
// changes then).
FAKE_NVML_CONTROL_API int fakeNvmlSetHealth(const char* uuid, const char* json_keys);

// Forgets every fakeNvmlSetHealth change (not the maintenance keys): the GPUs read as configured.
FAKE_NVML_CONTROL_API int fakeNvmlClearHealth(void);

// Makes calls of `function_name` ("*" = every NVML function) block for `seconds`, or until
// fakeNvmlReleaseHangs when 0 — a hung NVML call, as DCGM-style stalls are. A hung call holds
// no lock of the fake: other calls and the control socket go on.
FAKE_NVML_CONTROL_API int fakeNvmlHang(const char* function_name, unsigned int seconds);

// Ends every hang: blocked calls return (with their normal answer), later ones do not block.
FAKE_NVML_CONTROL_API int fakeNvmlReleaseHangs(void);

// How many NVML calls of this process are blocked in a hang right now.
FAKE_NVML_CONTROL_API int fakeNvmlHungCalls(unsigned int* calls);

// How many NVML calls this process made since the library was loaded (every entry point that
// checks for nvmlInit; not nvmlEventSetWait_v2), so a test can see that something did not call
// NVML at all.
FAKE_NVML_CONTROL_API int fakeNvmlCallCount(unsigned long long* calls);

typedef int (*fakeNvmlInjectXid_t)(const char*, unsigned long long);
typedef int (*fakeNvmlInjectEvent_t)(const char*, unsigned long long, unsigned long long);
typedef int (*fakeNvmlRegisteredEvents_t)(const char*, unsigned long long*);
typedef int (*fakeNvmlSetFailure_t)(const char*, int);
typedef int (*fakeNvmlClearFailures_t)(void);
typedef int (*fakeNvmlLastWaitTimeout_t)(unsigned int*);
typedef int (*fakeNvmlReloadConfig_t)(unsigned int*);
typedef int (*fakeNvmlSetHealth_t)(const char*, const char*);
typedef int (*fakeNvmlClearHealth_t)(void);
typedef int (*fakeNvmlHang_t)(const char*, unsigned int);
typedef int (*fakeNvmlReleaseHangs_t)(void);
typedef int (*fakeNvmlHungCalls_t)(unsigned int*);
typedef int (*fakeNvmlCallCount_t)(unsigned long long*);

#ifdef __cplusplus
}  // extern "C"
#endif
