import { describe, expect, it } from "vitest";
import { containerCommand, judgeReport, readContainerReport, VENDOR_CHECKS } from "./gpu-check-vendors.js";

const UUID_A = "GPU-1d5a3f2e-8c41-4b7e-9a0d-5f6e7c8b9a01";
const UUID_B = "GPU-2e6b4a3f-9d52-4c8f-8b1e-6a7f8d9cab12";

/** What the container's script prints, for a tool output and status. */
const logs = (devices: string[], tool: string | undefined, status = 0): string =>
  [
    "@@taskshim-devices",
    ...devices,
    "@@taskshim-tool",
    ...(tool === undefined ? ["@@missing"] : [tool, `@@rc ${status}`]),
    "@@taskshim-end",
    "",
  ].join("\n");

describe("the container's report", () => {
  it("is read only once its end marker is there", () => {
    expect(readContainerReport("@@taskshim-devices\n/dev/nvidia0\n")).toBeUndefined();
    expect(readContainerReport(logs(["/dev/nvidia0"], "out"))).toEqual({
      devices: ["/dev/nvidia0"],
      tool: { kind: "ran", status: 0, output: "out" },
    });
    expect(readContainerReport(logs([], undefined))).toEqual({ devices: [], tool: { kind: "missing" } });
  });

  it("runs the vendor's tool and lists its device glob under sh, then holds the GPUs", () => {
    const [sh, c, script] = containerCommand(VENDOR_CHECKS.nvidia, 3_600);
    expect([sh, c]).toEqual(["sh", "-c"]);
    expect(script).toContain("for f in /dev/nvidia[0-9]*;");
    expect(script).toContain("'nvidia-smi' '-L'");
    expect(script?.split("\n").at(-1)).toBe("exec sleep 3600");
  });
});

describe("NVIDIA: nvidia-smi -L by UUID, /dev/nvidiaN by count", () => {
  const check = VENDOR_CHECKS.nvidia;
  const listing = `GPU 0: NVIDIA H100 80GB HBM3 (UUID: ${UUID_A})\n  MIG 1g.10gb     Device  0: (UUID: MIG-aaaa)\n`;

  it("passes when the container sees exactly the task's GPU", () => {
    const judged = judgeReport(check, readContainerReport(logs(["/dev/nvidia0"], listing))!, [UUID_A]);
    expect(judged.devices).toEqual({ ok: true, detail: "1 /dev/nvidiaN (holds 1)" });
    expect(judged.tool).toEqual({ ok: true, detail: "1 by UUID, the task's" });
  });

  it("fails when it sees another GPU, or more than it holds", () => {
    const other = judgeReport(
      check,
      readContainerReport(logs(["/dev/nvidia1"], listing.replace(UUID_A, UUID_B)))!,
      [UUID_A],
    );
    expect(other.tool.ok).toBe(false);
    const two = `GPU 0: A (UUID: ${UUID_A})\nGPU 1: A (UUID: ${UUID_B})\n`;
    const more = judgeReport(check, readContainerReport(logs(["/dev/nvidia0", "/dev/nvidia1"], two))!, [
      UUID_A,
    ]);
    expect([more.devices.ok, more.tool.ok]).toEqual([false, false]);
  });

  it("fails on a tool that fails, and leaves a tool missing from the image unchecked", () => {
    expect(
      judgeReport(check, readContainerReport(logs([], "NVIDIA-SMI has failed", 9))!, [UUID_A]).tool,
    ).toEqual({
      ok: false,
      detail: "nvidia-smi -L exited 9",
    });
    expect(
      judgeReport(check, readContainerReport(logs(["/dev/nvidia0"], undefined))!, [UUID_A]).tool.ok,
    ).toBe("unchecked");
  });
});

describe("the other vendors", () => {
  it("AMD: render nodes by path, amd-smi list by count", () => {
    const amdList = "GPU: 0\n    BDF: 0000:0c:00.0\n    UUID: 1\n\nGPU: 1\n    BDF: 0000:22:00.0\n";
    const ids = ["/dev/dri/renderD128", "/dev/dri/renderD129"];
    const judged = judgeReport(VENDOR_CHECKS.amd, readContainerReport(logs(ids, amdList))!, ids);
    expect([judged.devices.ok, judged.tool.ok]).toEqual([true, true]);
    const wrong = judgeReport(
      VENDOR_CHECKS.amd,
      readContainerReport(logs(["/dev/dri/renderD130"], amdList))!,
      ["/dev/dri/renderD128"],
    );
    expect([wrong.devices.ok, wrong.tool.ok]).toEqual([false, false]);
  });

  it("Gaudi: /dev/accel/accelN and hl-smi's index column by count", () => {
    const judged = judgeReport(
      VENDOR_CHECKS.intel,
      readContainerReport(logs(["/dev/accel/accel0"], "0\n"))!,
      ["0"],
    );
    expect([judged.devices.ok, judged.tool.ok]).toEqual([true, true]);
  });

  it("Tenstorrent: /dev/tenstorrent/<index> by name; tt-smi's listing is not judged", () => {
    const judged = judgeReport(
      VENDOR_CHECKS.tenstorrent,
      readContainerReport(logs(["/dev/tenstorrent/1"], "boards…"))!,
      ["1"],
    );
    expect(judged.devices.ok).toBe(true);
    expect(judged.tool.ok).toBe("unchecked");
  });
});
