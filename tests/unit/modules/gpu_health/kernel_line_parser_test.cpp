// Kernel-line parser: every line variant the driver and the reset job print (lines shaped
// after real dmesg/journald output), malformed and truncated lines, garbage, NULs, invalid
// UTF-8 and enormous messages, and PCI address comparison across the Xid and NVML forms.
#include "modules/gpu_health/kernel_line_parser.hpp"
#include "support/printable_utf8.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {
namespace {

using namespace std::string_literals;

PciAddress Pci(std::string_view text) {
  auto pci = ParsePciAddress(text);
  EXPECT_TRUE(pci.has_value()) << text;
  return pci.value_or(PciAddress{});
}

using gns::test::PrintableUtf8;

struct XidCase {
  std::string name;
  std::string line;
  std::string pci;  // compared with SameDevice
  uint32_t xid;
  std::optional<uint32_t> pid;
  std::optional<std::string> process_name;
  std::optional<uint32_t> gpu_instance;
  std::optional<uint32_t> compute_instance;
  std::string detail;
};

class XidVariants : public ::testing::TestWithParam<XidCase> {};

TEST_P(XidVariants, ExtractsEveryField) {
  const XidCase& c = GetParam();
  const ParsedLine parsed = ParseKernelLine(c.line);
  ASSERT_EQ(parsed.kind(), LineKind::kXid)
      << (parsed.malformed() ? parsed.malformed()->Reason() : std::string(LineKindName(parsed.kind())));
  const XidLine& x = *parsed.xid();
  EXPECT_TRUE(x.pci.SameDevice(Pci(c.pci))) << x.pci.DeviceString();
  EXPECT_EQ(x.xid, c.xid);
  EXPECT_EQ(x.pid, c.pid);
  EXPECT_EQ(x.process_name(), c.process_name);
  EXPECT_EQ(x.gpu_instance, c.gpu_instance);
  EXPECT_EQ(x.compute_instance, c.compute_instance);
  EXPECT_EQ(x.detail(), c.detail);
  EXPECT_FALSE(x.detail_truncated());
}

INSTANTIATE_TEST_SUITE_P(
    KernelLog, XidVariants,
    ::testing::Values(
        XidCase{"UnknownPidAndName",
                "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
                "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
                "subpartition 0.",
                "0000:01:00", 48, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
                "at partition 6, subpartition 0."},
        XidCase{"PidAndName",
                "NVRM: Xid (PCI:0000:03:00): 48, pid=91237, name=nv-hostengine, Ch 00000076, "
                "errorString CTX SWITCH TIMEOUT, Info 0x3c046",
                "0000:03:00", 48, 91237u, "nv-hostengine"s, std::nullopt, std::nullopt,
                "Ch 00000076, errorString CTX SWITCH TIMEOUT, Info 0x3c046"},
        XidCase{"FallenOffTheBusAsXid79",
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
                "0000:3b:00", 79, 1u, "python3"s, std::nullopt, std::nullopt,
                "GPU has fallen off the bus."},
        XidCase{"OldDriverWithoutPidOrName",
                "NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000", "0000:01:00",
                32, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                "Channel ID 00000009 intr 00800000"},
        XidCase{"VeryOldFormWithoutPciPrefix", "NVRM: Xid (0000:03:00): 14, Channel 00000001",
                "0000:03:00", 14, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                "Channel 00000001"},
        XidCase{"PidWithoutName",
                "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
                "remapping, reset gpu to activate.",
                "0000:10:1c", 63, 1896u, std::nullopt, std::nullopt, std::nullopt,
                "Row Remapper: New row marked for remapping, reset gpu to activate."},
        XidCase{"MigGpuInstance",
                "NVRM: Xid (PCI:0000:cb:00 GPU-I:05): 31, pid=12345, name=python, Ch 00000008, "
                "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
                "0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
                "0000:cb:00", 31, 12345u, "python"s, 5u, std::nullopt,
                "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
                "0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"},
        XidCase{"MigGpuAndComputeInstance",
                "NVRM: Xid (PCI:0000:cb:00 GPU-I:01 GPU-CI:02): 13, pid=4242, name=train.py, "
                "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
                "0000:cb:00", 13, 4242u, "train.py"s, 1u, 2u,
                "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"},
        XidCase{"DmesgCtimePrefix",
                "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
                "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 0, SM 1): Out Of Range "
                "Address",
                "0000:cb:00", 13, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                "Graphics SM Warp Exception on (GPC 7, TPC 0, SM 1): Out Of Range Address"},
        XidCase{"SyslogPrefixAndBracketedName",
                "Sep 12 14:25:44 host kernel: [16450076.435595] NVRM: Xid (PCI:0002:00:00): 119, "
                "pid=1582259, name=nvc:[driver], Timeout after 6s of waiting for RPC response from "
                "GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
                "0002:00:00", 119, 1582259u, "nvc:[driver]"s, std::nullopt, std::nullopt,
                "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 "
                "(GSP_RM_CONTROL) (0x20802a02 0x8)."},
        XidCase{"PciWithFunction",
                "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=12345, GPU has fallen off the bus.",
                "0000:b3:00", 79, 12345u, std::nullopt, std::nullopt, std::nullopt,
                "GPU has fallen off the bus."},
        XidCase{"NumberOnly", "NVRM: Xid (PCI:0000:01:00): 79", "0000:01:00", 79, std::nullopt,
                std::nullopt, std::nullopt, std::nullopt, ""},
        XidCase{"EmptyDetailAfterName",
                "NVRM: Xid (PCI:0000:01:00): 43, pid=77, name=cuda_app", "0000:01:00", 43, 77u,
                "cuda_app"s, std::nullopt, std::nullopt, ""},
        XidCase{"UppercaseHexAndTrailingNewline",
                "NVRM: Xid (PCI:0000:3B:00): 94, pid=5, name=a, Contained: SM (0x1). RST: No, "
                "D-RST: No\n",
                "0000:3b:00", 94, 5u, "a"s, std::nullopt, std::nullopt,
                "Contained: SM (0x1). RST: No, D-RST: No"},
        XidCase{"MultiLineMessageUsesTheXidLine",
                "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
                "system has\nNVRM: fallen off the bus and is not responding to commands.\nNVRM: Xid "
                "(PCI:0000:b3:00): 79, pid=12345, name=x, GPU has fallen off the bus.",
                "0000:b3:00", 79, 12345u, "x"s, std::nullopt, std::nullopt,
                "GPU has fallen off the bus."}),
    [](const ::testing::TestParamInfo<XidCase>& info) { return info.param.name; });

TEST(KernelLineParser, GpuUuidLineTeachesPciToUuid) {
  const ParsedLine p =
      ParseKernelLine("NVRM: GPU at PCI:0000:03:00: GPU-455d8f70-2051-db6c-0430-ffc457bff834");
  ASSERT_EQ(p.kind(), LineKind::kGpuUuid);
  EXPECT_TRUE(p.gpu_uuid()->pci.SameDevice(Pci("00000000:03:00.0")));
  EXPECT_EQ(p.gpu_uuid()->uuid, "GPU-455d8f70-2051-db6c-0430-ffc457bff834");

  const ParsedLine with_function = ParseKernelLine("[ 12.5] NVRM: GPU at PCI:0000:00:08.0: GPU-123");
  ASSERT_EQ(with_function.kind(), LineKind::kGpuUuid);
  EXPECT_EQ(with_function.gpu_uuid()->uuid, "GPU-123");
  EXPECT_EQ(with_function.gpu_uuid()->pci.device, 8);
}

TEST(KernelLineParser, FallenOffTheBusForms) {
  {
    const ParsedLine p = ParseKernelLine("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.");
    ASSERT_EQ(p.kind(), LineKind::kFallenOffBus);
    ASSERT_TRUE(p.fallen_off_bus()->pci.has_value());
    EXPECT_TRUE(p.fallen_off_bus()->pci->SameDevice(Pci("0000:3b:00")));
  }
  {
    // journald keeps the probe-time printk together, newlines included.
    const ParsedLine p = ParseKernelLine(
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system "
        "has\nNVRM: fallen off the bus and is not responding to commands.\n");
    ASSERT_EQ(p.kind(), LineKind::kFallenOffBus);
    ASSERT_TRUE(p.fallen_off_bus()->pci.has_value());
    EXPECT_TRUE(p.fallen_off_bus()->pci->SameDevice(Pci("00000000:B3:00.0")));
  }
  {
    const ParsedLine p = ParseKernelLine(
        "NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06) installed in this system has "
        "fallen off the bus and is not responding to commands.");
    ASSERT_EQ(p.kind(), LineKind::kFallenOffBus);
    ASSERT_TRUE(p.fallen_off_bus()->pci.has_value());
    EXPECT_EQ(p.fallen_off_bus()->pci->DeviceString(), "0000:0e:00");
  }
  {
    // A forwarder that split the message leaves the continuation without an address.
    const ParsedLine p =
        ParseKernelLine("NVRM: fallen off the bus and is not responding to commands.");
    ASSERT_EQ(p.kind(), LineKind::kFallenOffBus);
    EXPECT_FALSE(p.fallen_off_bus()->pci.has_value());
  }
}

TEST(KernelLineParser, ResetAcknowledgementForms) {
  {
    const ParsedLine p = ParseKernelLine("GPU reset occurred: GPU-455d8f70-2051-db6c-0430-ffc457bff834");
    ASSERT_EQ(p.kind(), LineKind::kResetAck);
    EXPECT_EQ(p.reset_ack()->uuid, "GPU-455d8f70-2051-db6c-0430-ffc457bff834");
    EXPECT_FALSE(p.reset_ack()->success.has_value());
  }
  {
    const ParsedLine p = ParseKernelLine(
        "kernel: [16450076.435595] GPU reset executed: GPU-22222222-2222-2222-2222-222222222222");
    ASSERT_EQ(p.kind(), LineKind::kResetAck);
    EXPECT_EQ(p.reset_ack()->uuid, "GPU-22222222-2222-2222-2222-222222222222");
    EXPECT_FALSE(p.reset_ack()->success.has_value());
  }
  {
    const ParsedLine p = ParseKernelLine(
        "GPU reset executed: GPU-52f37cd4-d92a-7b6d-2b9f-9ab862e27708, success: true");
    ASSERT_EQ(p.kind(), LineKind::kResetAck);
    EXPECT_EQ(p.reset_ack()->success, true);
  }
  {
    const ParsedLine p = ParseKernelLine(
        "GPU reset executed: GPU-52f37cd4-d92a-7b6d-2b9f-9ab862e27708, success: false");
    ASSERT_EQ(p.kind(), LineKind::kResetAck);
    EXPECT_EQ(p.reset_ack()->success, false);
  }
}

TEST(KernelLineParser, UnrelatedLines) {
  for (const std::string& line : {
           ""s,
           // An SXid report's companion lines (the report itself is kSxid, below).
           "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00"s,
           "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500}"s,
           "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  525.125.06  Tue May 30 05:11:37 UTC 2023"s,
           "NVRM: GPU Board Serial Number: 1324023049334"s,
           "NVRM: The NVIDIA GPU 0000:5d:00.0"s,  // a split header alone says nothing yet
           "NVRM: Xids are reported below"s,
           "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context"s,
           "usb 1-1: new high-speed USB device number 2 using xhci_hcd"s,
           "Xid (PCI:0000:03:00): 48, pid=1, name=x, not from the driver"s,
       }) {
    EXPECT_EQ(ParseKernelLine(line).kind(), LineKind::kUnrelated) << line;
  }
}

// NVSwitch SXid reports as public reports show them: NVIDIA/nvtrust issue 124 (a boot's
// Non-fatal DLREQ interrupts), leptonai/gpud's kmsg examples (20034 LTSSM Fault Up, 12028, a
// 20034 group after XID 79) and NVIDIA/NVSentinel's syslog monitor tests (24007 sourcetrack
// timeout); the forms without a link and "Correctable" as the NVSwitch driver's print macros
// write them ("Fatal, <text>", "Correctable, Link %02d <text>").
TEST(KernelLineParser, SxidReports) {
  struct Case {
    std::string line;
    std::optional<uint32_t> nvswitch;
    std::string pci;
    uint32_t sxid;
    bool fatal;
    std::optional<uint32_t> link;
    std::string detail;
  };
  for (const Case& c : std::vector<Case>{
           {"[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt",
            3, "0000:04:00.0", 22013, false, 44, "Minion Link DLREQ interrupt"},
           {"[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up", 0,
            "0000:00:00.0", 20034, true, 30, "LTSSM Fault Up"},
           {"[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
            0, "0000:c3:00.0", 24007, true, 28, "sourcetrack timeout error (First)"},
           {"nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)  ",
            3, "0000:05:00.0", 12028, false, 32, "egress non-posted PRIV error (First)"},
           // A forwarder that dropped the "nvidia-nvswitchN: " prefix: the switch number is unknown.
           {"kernel: SXid (PCI:0000:cd:00.0): 20034, Fatal, Link 24 LTSSM Fault Up", std::nullopt, "0000:cd:00.0", 20034,
            true, 24, "LTSSM Fault Up"},
           // gpud's example: the switches of an HGX board after a GPU fell off the bus.
           {"[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up", 1,
            "0000:06:00.0", 20034, true, 48, "LTSSM Fault Up"},
           {"[6781753.404587] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up", 0,
            "0000:05:00.0", 20034, true, 63, "LTSSM Fault Up"},
           {"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Fatal, Link 32 egress non-posted PRIV error (First)", 0,
            "0000:05:00.0", 12028, true, 32, "egress non-posted PRIV error (First)"},
           {"nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 11004, Non-fatal, Link 08 ingress invalid ACL (First)", 2,
            "0000:07:00.0", 11004, false, 8, "ingress invalid ACL (First)"},
           {"nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 19084, Non-fatal, Link 09 AN1 Heartbeat Timeout Error", 2,
            "0000:07:00.0", 19084, false, 9, "AN1 Heartbeat Timeout Error"},
           // "%05d" pads the number; the link is "%02d".
           {"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 01004, Non-fatal, Link 00 ingress ECC error", 1, "0000:06:00.0",
            1004, false, 0, "ingress ECC error"},
           {"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 19049, Correctable, Link 11 single-bit ECC error", 1,
            "0000:06:00.0", 19049, false, 11, "single-bit ECC error"},
           // No link: an error of the switch itself.
           {"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 10001, Fatal, Unexpected PRI error", 0, "0000:05:00.0", 10001,
            true, std::nullopt, "Unexpected PRI error"},
           {"nvidia-nvswitch4: SXid (PCI:0000:08:00.0): 26006, Fatal, Failed to post command to SOE. Data {0x00000001, "
            "0x00000010, 0x00000000, 0x00000002, 0x00000003, 0x00000000}",
            4, "0000:08:00.0", 26006, true, std::nullopt,
            "Failed to post command to SOE. Data {0x00000001, 0x00000010, 0x00000000, 0x00000002, 0x00000003, "
            "0x00000000}"},
       }) {
    const ParsedLine p = ParseKernelLine(c.line);
    ASSERT_EQ(p.kind(), LineKind::kSxid) << c.line;
    const SxidLine& s = *p.sxid();
    EXPECT_EQ(s.nvswitch, c.nvswitch) << c.line;
    EXPECT_EQ(s.pci, Pci(c.pci)) << c.line;
    EXPECT_TRUE(s.pci.has_function) << c.line;
    EXPECT_EQ(s.sxid, c.sxid) << c.line;
    EXPECT_EQ(s.fatal, c.fatal) << c.line;
    EXPECT_EQ(s.link, c.link) << c.line;
    EXPECT_EQ(s.detail(), c.detail) << c.line;
  }
  // The companions of a report and reports without a severity word are not reports of their own.
  for (const std::string line : {
           "[6781753.404848] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
           "[6781753.406566] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, "
           "0x10000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
           "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 10012, IO failure",
       }) {
    EXPECT_EQ(ParseKernelLine(line).kind(), LineKind::kUnrelated) << line;
  }
  // An Xid in the same message still wins: it is the GPU's.
  EXPECT_EQ(ParseKernelLine("nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 x\n"
                            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=p, GPU has fallen off the bus.")
                .kind(),
            LineKind::kXid);
}

TEST(KernelLineParser, BrokenSxidReportsSayWhatWasExpectedWhere) {
  struct Case {
    std::string line;
    std::size_t offset;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"nvidia-nvswitch0: SXid (PCI:zz:00:00.0): 20034, Fatal, Link 30 x", 28, "expected a hex PCI domain"},
           {"nvidia-nvswitch0: SXid (PCI:0000:c3:00.0) 20034, Fatal, Link 30 x", 41, "expected ':' after ')'"},
           {"nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): , Fatal, Link 30 x", 43, "expected the SXid number"},
           {"nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 99999999999, Fatal, Link 30 x", 43,
            "SXid number does not fit in 32 bits"},
           {"nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link x", 62,
            "expected the NVSwitch link number after 'Link '"},
       }) {
    const ParsedLine p = ParseKernelLine(c.line);
    ASSERT_EQ(p.kind(), LineKind::kMalformed) << c.line;
    EXPECT_EQ(p.malformed()->attempted, LineKind::kSxid) << c.line;
    EXPECT_EQ(p.malformed()->offset, c.offset) << c.line;
    EXPECT_EQ(p.malformed()->expected, c.expected) << c.line;
  }
}

struct MalformedCase {
  std::string name;
  std::string line;
  LineKind attempted;
  std::size_t offset;
  std::string expected;
};

class MalformedLines : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedLines, SayWhatWasExpectedWhere) {
  const MalformedCase& c = GetParam();
  const ParsedLine p = ParseKernelLine(c.line);
  ASSERT_EQ(p.kind(), LineKind::kMalformed) << LineKindName(p.kind());
  EXPECT_EQ(p.malformed()->attempted, c.attempted);
  EXPECT_EQ(p.malformed()->offset, c.offset);
  EXPECT_EQ(p.malformed()->expected, c.expected);
  EXPECT_EQ(p.malformed()->Reason(), std::string(LineKindName(c.attempted)) + " line, byte " +
                                         std::to_string(c.offset) + ": " + c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    KernelLog, MalformedLines,
    ::testing::Values(
        MalformedCase{"MarkerOnly", "NVRM: Xid", LineKind::kXid, 9, "expected '(' after 'NVRM: Xid'"},
        MalformedCase{"BusWithoutDevice", "NVRM: Xid (PCI:0000:3b): 79", LineKind::kXid, 22,
                      "expected ':' after the PCI bus"},
        MalformedCase{"TruncatedInsideAddress", "NVRM: Xid (PCI:0000:3", LineKind::kXid, 21,
                      "expected ':' after the PCI bus"},
        MalformedCase{"NoDomainDigits", "NVRM: Xid (PCI:zz:3b:00): 79", LineKind::kXid, 15,
                      "expected a hex PCI domain"},
        MalformedCase{"DeviceOutOfRange", "NVRM: Xid (PCI:0000:3b:20): 79", LineKind::kXid, 23,
                      "expected a hex PCI device number (00-1f)"},
        MalformedCase{"BadFunction", "NVRM: Xid (PCI:0000:3b:00.9): 79", LineKind::kXid, 26,
                      "expected a PCI function (0-7) after '.'"},
        MalformedCase{"BadGpuInstance", "NVRM: Xid (PCI:0000:3b:00 GPU-I:xx): 13", LineKind::kXid,
                      32, "expected a GPU instance number after 'GPU-I:'"},
        MalformedCase{"MissingCloseParen", "NVRM: Xid (PCI:0000:3b:00 13", LineKind::kXid, 25,
                      "expected ')' after the PCI address"},
        MalformedCase{"MissingColon", "NVRM: Xid (PCI:0000:3b:00) 13", LineKind::kXid, 26,
                      "expected ':' after ')'"},
        MalformedCase{"NoXidNumber", "NVRM: Xid (PCI:0000:3b:00): abc", LineKind::kXid, 28,
                      "expected the XID number"},
        MalformedCase{"NegativeXid", "NVRM: Xid (PCI:0000:3b:00): -1, x", LineKind::kXid, 28,
                      "expected the XID number"},
        MalformedCase{"XidTooLarge", "NVRM: Xid (PCI:0000:3b:00): 99999999999, x", LineKind::kXid,
                      28, "XID number does not fit in 32 bits"},
        MalformedCase{"NoCommaAfterXid", "NVRM: Xid (PCI:0000:3b:00): 79 pid=1", LineKind::kXid, 30,
                      "expected ',' after the XID number"},
        MalformedCase{"BadPid", "NVRM: Xid (PCI:0000:3b:00): 13, pid=abc, name=x, y",
                      LineKind::kXid, 36, "expected a process id or '<unknown>' after 'pid='"},
        MalformedCase{"NoCommaAfterPid", "NVRM: Xid (PCI:0000:3b:00): 13, pid=12 name=x",
                      LineKind::kXid, 38, "expected ',' after the pid"},
        MalformedCase{"UuidLineWithoutUuid", "NVRM: GPU at PCI:0000:03:00: 455d8f70",
                      LineKind::kGpuUuid, 29, "expected 'GPU-' followed by hex digits and dashes"},
        MalformedCase{"UuidLineBadUuid", "NVRM: GPU at PCI:0000:03:00: GPU-zz",
                      LineKind::kGpuUuid, 29, "expected 'GPU-' followed by hex digits and dashes"},
        MalformedCase{"UuidLineBadAddress", "NVRM: GPU at PCI:0000:03: GPU-1", LineKind::kGpuUuid,
                      25, "expected a hex PCI device number (00-1f)"},
        MalformedCase{"ResetWithPlaceholder", "GPU reset executed: ${UUID}", LineKind::kResetAck,
                      20, "expected 'GPU-' followed by hex digits and dashes"},
        MalformedCase{"ResetBadSuccess", "GPU reset executed: GPU-1a, success: maybe",
                      LineKind::kResetAck, 37, "expected 'true' or 'false' after 'success: '"}),
    [](const ::testing::TestParamInfo<MalformedCase>& info) { return info.param.name; });

TEST(KernelLineParser, EveryPrefixOfAnXidLineIsXidOrMalformed) {
  const std::string line =
      "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 79, pid=1, name=python3, GPU has fallen off "
      "the bus.";
  const std::size_t marker = std::string_view("NVRM: Xid").size();
  for (std::size_t n = 0; n <= line.size(); ++n) {
    const ParsedLine p = ParseKernelLine(std::string_view(line).substr(0, n));
    if (n < marker) {
      EXPECT_EQ(p.kind(), LineKind::kUnrelated) << n;
    } else {
      EXPECT_TRUE(p.kind() == LineKind::kXid || p.kind() == LineKind::kMalformed) << n;
    }
  }
}

TEST(KernelLineParser, NulBytesAndInvalidUtf8AreSanitised) {
  const std::string line =
      "NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=a\0b, de\0tail \xff\xfe caf\xc3\xa9 \xe2\x82"s;
  const ParsedLine p = ParseKernelLine(line);
  ASSERT_EQ(p.kind(), LineKind::kXid);
  EXPECT_EQ(p.xid()->process_name(), "a?b");
  // é stays; the lone 0xff, 0xfe and the cut-off 3-byte sequence become '?'.
  EXPECT_EQ(p.xid()->detail(), "de?tail ?? caf\xc3\xa9 ??");
  EXPECT_TRUE(PrintableUtf8(p.xid()->detail()));
}

TEST(KernelLineParser, EnormousInputsAreCapped) {
  // 1 MiB of noise before a real line: still found.
  std::string prefixed(1 << 20, 'A');
  prefixed += " NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=x, DBE";
  const ParsedLine found = ParseKernelLine(prefixed);
  ASSERT_EQ(found.kind(), LineKind::kXid);
  EXPECT_EQ(found.xid()->detail(), "DBE");

  // A 4 MiB detail of two-byte characters is cut at a character boundary.
  std::string huge = "NVRM: Xid (PCI:0000:01:00): 48, pid=1, name=";
  huge += std::string(100000, 'n');
  huge += ", ";
  for (int i = 0; i < (1 << 21); ++i) huge += "\xc3\xa9";
  const ParsedLine capped = ParseKernelLine(huge);
  ASSERT_EQ(capped.kind(), LineKind::kXid);
  EXPECT_LE(capped.xid()->detail().size(), kMaxDetailBytes);
  EXPECT_GE(capped.xid()->detail().size(), kMaxDetailBytes - 1);
  EXPECT_TRUE(capped.xid()->detail_truncated());
  EXPECT_TRUE(PrintableUtf8(capped.xid()->detail()));
  ASSERT_TRUE(capped.xid()->process_name().has_value());
  EXPECT_EQ(capped.xid()->process_name()->size(), kMaxProcessNameBytes);

  // A run of digits in the XID field is rejected without overflow.
  std::string digits = "NVRM: Xid (PCI:0000:01:00): " + std::string(1 << 20, '9') + ", x";
  EXPECT_EQ(ParseKernelLine(digits).kind(), LineKind::kMalformed);

  // An endless UUID is refused.
  std::string uuid = "GPU reset executed: GPU-" + std::string(1 << 20, 'a');
  EXPECT_EQ(ParseKernelLine(uuid).kind(), LineKind::kMalformed);
}

TEST(KernelLineParser, PseudoRandomGarbageNeverBreaksInvariants) {
  // Deterministic LCG: the same bytes every run. Half the messages start from a real line
  // with random bytes overwritten, half are pure noise over the whole byte range.
  const std::string seed = "NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 79, pid=1, name=p, GPU gone";
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  for (int i = 0; i < 20000; ++i) {
    std::string msg;
    if (i % 2 == 0) {
      msg = seed;
      for (int k = 0; k < 3; ++k) msg[next() % msg.size()] = static_cast<char>(next() & 0xFF);
    } else {
      msg.resize(next() % 200);
      for (char& ch : msg) ch = static_cast<char>(next() & 0xFF);
    }
    const ParsedLine p = ParseKernelLine(msg);
    if (const XidLine* x = p.xid()) {
      EXPECT_LE(x->detail().size(), kMaxDetailBytes);
      EXPECT_TRUE(PrintableUtf8(x->detail()));
      if (x->process_name()) {
        EXPECT_TRUE(PrintableUtf8(*x->process_name()));
      }
    }
    if (const MalformedLine* m = p.malformed()) {
      EXPECT_LE(m->offset, msg.size());
      EXPECT_FALSE(m->expected.empty());
    }
  }
}

TEST(PciAddress, ComparesNumericallyAcrossForms) {
  const PciAddress from_xid = Pci("0000:3b:00");
  const PciAddress from_nvml = Pci("00000000:3B:00.0");
  EXPECT_TRUE(from_xid.SameDevice(from_nvml));
  EXPECT_EQ(from_xid.DeviceKey(), from_nvml.DeviceKey());
  EXPECT_EQ(from_nvml.DeviceString(), "0000:3b:00");
  EXPECT_TRUE(from_nvml.has_function);
  EXPECT_FALSE(from_xid.has_function);

  EXPECT_TRUE(Pci("3b:00.0").SameDevice(from_xid));  // lspci short form, domain 0
  EXPECT_FALSE(Pci("0000:3c:00").SameDevice(from_xid));
  EXPECT_FALSE(Pci("0001:3b:00").SameDevice(from_xid));
  EXPECT_FALSE(Pci("0000:3b:01").SameDevice(from_xid));
  EXPECT_TRUE(Pci("0000:3b:00.1").SameDevice(from_xid));  // function does not matter
  EXPECT_EQ(Pci("00010000:01:1f.7").DeviceString(), "10000:01:1f");

  // The Xid line and the NVML busId name the same GPU.
  const ParsedLine p = ParseKernelLine("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
  ASSERT_EQ(p.kind(), LineKind::kXid);
  EXPECT_TRUE(p.xid()->pci.SameDevice(from_nvml));

  EXPECT_TRUE(Pci("3b:00").SameDevice(from_xid));  // bus:device, domain 0 (one grammar for every module)
  for (std::string_view bad : {"", "0000:3b", "0000:3b:00.8", "0000:3b:20", "000000000:3b:00",
                               "0000:3b:00 ", "zz:00.0", "0000::00", ":3b:00"}) {
    EXPECT_FALSE(ParsePciAddress(bad).has_value()) << bad;
  }
}

TEST(KernelLineParserTest, ResetStartedIsAnAcknowledgementOfItsOwn) {
  const ParsedLine p = ParseKernelLine("GPU reset started: GPU-455d8f70-2051-db6c-0430-ffc457bff834");
  ASSERT_EQ(p.kind(), LineKind::kResetAck);
  EXPECT_TRUE(p.reset_ack()->started);
  EXPECT_EQ(p.reset_ack()->uuid, "GPU-455d8f70-2051-db6c-0430-ffc457bff834");
  EXPECT_FALSE(ParseKernelLine("GPU reset occurred: GPU-455d8f70-2051-db6c-0430-ffc457bff834").reset_ack()->started);
  EXPECT_EQ(ParseKernelLine("GPU reset started: not-a-gpu").kind(), LineKind::kMalformed);
}

}  // namespace
}  // namespace gns::gpu_health
