import type { AcceleratorVendor } from "../host/gpu-inventory.js";

/*
 * What `taskshim check-gpu` runs inside a task's container on each vendor, and how it reads the
 * answer: the vendor's device nodes the container sees, and its tool's listing. Both must name
 * exactly the GPUs the task holds (its `gpus_ids`). The tools are dstack's (the same ones the
 * shim reads at startup), and only their listings are read: `nvidia-smi -L` by UUID, `amd-smi
 * list` and `hl-smi` by count; `tt-smi`'s listing is not parsed (its exit status is checked).
 */

/** The verdict of one look inside a container. */
export interface Seen {
  readonly ok: boolean | "unchecked";
  /** What was seen, in a few words for the table. */
  readonly detail: string;
}

/** A vendor's checks. */
export interface VendorCheck {
  /** The default image: one whose tool the vendor's runtime injects or the image ships. */
  readonly image: string;
  /** A shell glob of the vendor's GPU device nodes in the container. */
  readonly deviceGlob: string;
  readonly tool: readonly string[];
  /** Whether the device nodes seen are exactly the task's GPUs `ids`. */
  devices(nodes: readonly string[], ids: readonly string[]): Seen;
  /** Whether the tool's listing names exactly the task's GPUs. */
  listing(output: string, ids: readonly string[]): Seen;
}

const sameSet = (a: readonly string[], b: readonly string[]): boolean =>
  a.length === b.length && [...a].sort().join("\n") === [...b].sort().join("\n");

const counted = (what: string, seen: number, ids: readonly string[]): Seen => ({
  ok: seen === ids.length,
  detail: `${seen} ${what} (holds ${ids.length})`,
});

/** Per vendor. The images are defaults an operator replaces with `--image`. */
export const VENDOR_CHECKS: Readonly<Record<AcceleratorVendor, VendorCheck>> = {
  nvidia: {
    // The NVIDIA Container Toolkit mounts nvidia-smi into any image (the `utility` capability).
    image: "nvidia/cuda:12.8.1-base-ubuntu24.04",
    deviceGlob: "/dev/nvidia[0-9]*",
    tool: ["nvidia-smi", "-L"],
    devices: (nodes, ids) => counted("/dev/nvidiaN", nodes.length, ids),
    listing: (output, ids) => {
      // `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)`; MIG lines are indented and not GPUs of their own.
      const uuids = [...output.matchAll(/^GPU \d+:.*\(UUID: (GPU-[0-9A-Za-z-]+)\)/gm)].map((m) => m[1] ?? "");
      return {
        ok: sameSet(uuids, ids),
        detail: `${uuids.length} by UUID${sameSet(uuids, ids) ? ", the task's" : ""}`,
      };
    },
  },
  amd: {
    image: "rocm/dev-ubuntu-24.04:6.4.1",
    deviceGlob: "/dev/dri/renderD*",
    tool: ["amd-smi", "list"],
    // AMD GPUs are their render nodes: the container's are the task's ids, by path.
    devices: (nodes, ids) => ({
      ok: sameSet(nodes, ids),
      detail: `${nodes.length} render nodes${sameSet(nodes, ids) ? ", the task's" : ""}`,
    }),
    listing: (output, ids) => counted("listed", [...output.matchAll(/^GPU:\s*\d+\s*$/gm)].length, ids),
  },
  intel: {
    image: "vault.habana.ai/gaudi-docker/1.21.0/ubuntu24.04/habanalabs/pytorch-installer-2.6.0:latest",
    deviceGlob: "/dev/accel/accel[0-9]*",
    tool: ["hl-smi", "-Q", "index", "-f", "csv,noheader"],
    devices: (nodes, ids) => counted("/dev/accel/accelN", nodes.length, ids),
    listing: (output, ids) =>
      counted("listed", output.split("\n").filter((l) => /^\s*\d+\s*$/.test(l)).length, ids),
  },
  tenstorrent: {
    // No public image ships tt-smi: pass --image with one, or the tool check says it is missing.
    image: "ubuntu:24.04",
    deviceGlob: "/dev/tenstorrent/*",
    tool: ["tt-smi", "-ls"],
    // Tenstorrent GPUs are their index: /dev/tenstorrent/<index>.
    devices: (nodes, ids) => {
      const names = nodes.map((n) => n.slice(n.lastIndexOf("/") + 1));
      return {
        ok: sameSet(names, ids),
        detail: `${nodes.length} devices${sameSet(names, ids) ? ", the task's" : ""}`,
      };
    },
    listing: () => ({ ok: "unchecked", detail: "ran; its listing is not parsed" }),
  },
};

/** The markers the container's script prints between its parts. */
const MARK = { devices: "@@taskshim-devices", tool: "@@taskshim-tool", end: "@@taskshim-end" } as const;

/** Single-quoted for sh. */
const quote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * The container's command: the device nodes, the tool's listing and its status between markers,
 * then a sleep so the task holds its GPUs until the check terminates it.
 */
export function containerCommand(check: VendorCheck, holdSeconds: number): string[] {
  const [tool = "", ...args] = check.tool;
  const script = [
    `echo ${MARK.devices}`,
    `for f in ${check.deviceGlob}; do [ -e "$f" ] && echo "$f"; done`,
    `echo ${MARK.tool}`,
    `if command -v ${quote(tool)} >/dev/null 2>&1; then ${[tool, ...args].map(quote).join(" ")} 2>&1; echo "@@rc $?"; else echo "@@missing"; fi`,
    `echo ${MARK.end}`,
    `exec sleep ${holdSeconds}`,
  ].join("\n");
  return ["sh", "-c", script];
}

/** What the container printed, read back from its logs; undefined until its end marker. */
export interface ContainerReport {
  readonly devices: readonly string[];
  readonly tool:
    { readonly kind: "missing" } | { readonly kind: "ran"; readonly status: number; readonly output: string };
}

/** Reads {@link containerCommand}'s output from the task's logs. */
export function readContainerReport(logs: string): ContainerReport | undefined {
  const lines = logs.split(/\r?\n/);
  const at = (marker: string) => lines.findIndex((l) => l.trim() === marker);
  const [d, t, e] = [at(MARK.devices), at(MARK.tool), at(MARK.end)];
  if (d < 0 || t < d || e < t) return undefined;
  const devices = lines
    .slice(d + 1, t)
    .map((l) => l.trim())
    .filter(Boolean);
  const toolLines = lines.slice(t + 1, e);
  if (toolLines.some((l) => l.trim() === "@@missing")) return { devices, tool: { kind: "missing" } };
  const rcLine = toolLines.findLastIndex((l) => /^@@rc \d+$/.test(l.trim()));
  const status = rcLine < 0 ? -1 : Number(toolLines[rcLine]?.trim().slice(4));
  return {
    devices,
    tool: { kind: "ran", status, output: toolLines.slice(0, Math.max(0, rcLine)).join("\n") },
  };
}

/** The verdicts of one container: its devices and its tool. */
export function judgeReport(
  check: VendorCheck,
  report: ContainerReport,
  ids: readonly string[],
): { devices: Seen; tool: Seen } {
  const devices = check.devices(report.devices, ids);
  const tool: Seen =
    report.tool.kind === "missing"
      ? { ok: "unchecked", detail: `${check.tool[0] ?? ""} is not in the image (see --image)` }
      : report.tool.status !== 0
        ? { ok: false, detail: `${check.tool.join(" ")} exited ${report.tool.status}` }
        : check.listing(report.tool.output, ids);
  return { devices, tool };
}
