/*
 * Test doubles of src/dcgm/: a recorded-style DCGM Exporter answer of three GPUs, and the script
 * of a fake `dcgm-exporter` (a Node program serving that answer) for the supervisor's tests and
 * the end-to-end test.
 */

/** Three GPUs' UUIDs, as an 3-GPU host's exporter names them. */
export const EXPORTER_GPUS = [
  "GPU-1d5a3f2e-8c41-4b7e-9a0d-5f6e7c8b9a01",
  "GPU-2e6b4a3f-9d52-4c8f-8b1e-6a7f8d9cab12",
  "GPU-3f7c5b4a-ae63-4d90-9c2f-7b8a9eadbc23",
] as const;

const labels = (index: number): string =>
  `gpu="${index}",UUID="${EXPORTER_GPUS[index] ?? ""}",pci_bus_id="00000000:0${index + 1}:00.0",device="nvidia${index}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-host-1",DCGM_FI_DRIVER_VERSION="570.86.15"`;

/**
 * DCGM Exporter's answer as it writes it: HELP and TYPE per metric, one sample per GPU, a metric
 * (`DCGM_FI_DEV_XID_ERRORS`) with a sample of GPU 2 only, blank lines and a free comment.
 */
export function exporterText(values: { readonly util?: readonly number[] } = {}): string {
  const util = values.util ?? [93, 0, 41];
  return [
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (%).",
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ...[0, 1, 2].map((i) => `DCGM_FI_DEV_GPU_UTIL{${labels(i)}} ${util[i] ?? 0}`),
    "# HELP DCGM_FI_DEV_FB_USED Used framebuffer memory (MiB).",
    "# TYPE DCGM_FI_DEV_FB_USED gauge",
    ...[0, 1, 2].map((i) => `DCGM_FI_DEV_FB_USED{${labels(i)}} ${[61234, 0, 2048][i] ?? 0}`),
    "",
    "# a comment the exporter does not write, but a proxy could",
    "# HELP DCGM_FI_DEV_XID_ERRORS The last XID error seen.",
    "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
    `DCGM_FI_DEV_XID_ERRORS{${labels(2)},err_code="79",err_msg="GPU has fallen off the bus"} 79`,
    "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Energy consumed since boot (mJ).",
    "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
    ...[0, 1, 2].map((i) => `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{${labels(i)}} ${1_000_000 * (i + 1)}`),
    "",
  ].join("\n");
}

/**
 * A fake `dcgm-exporter`, run by `node`: `-v` prints a version; otherwise it serves
 * {@link exporterText} at `/metrics` on the port of `-a localhost:<port>` after `FAKE_EXPORTER_DELAY_MS`
 * (default 0), records its pid and arguments in `FAKE_EXPORTER_LOG` (one JSON line per start),
 * exits at SIGTERM unless `FAKE_EXPORTER_IGNORE_TERM=1`, and exits with 3 at once when
 * `FAKE_EXPORTER_FAIL=1`.
 */
export function fakeExporterScript(nodePath: string): string {
  return `#!${nodePath}
const http = require("node:http");
const fs = require("node:fs");
const args = process.argv.slice(2);
if (args[0] === "-v") { console.log("DCGM Exporter version 4.2.3-4.1.3-fake"); process.exit(0); }
if (process.env.FAKE_EXPORTER_FAIL === "1") { console.error("fake: failing at start"); process.exit(3); }
const address = args[args.indexOf("-a") + 1] || "localhost:9400";
const port = Number(address.split(":").pop());
if (process.env.FAKE_EXPORTER_LOG) fs.appendFileSync(process.env.FAKE_EXPORTER_LOG, JSON.stringify({ pid: process.pid, args }) + "\\n");
if (process.env.FAKE_EXPORTER_IGNORE_TERM === "1") process.on("SIGTERM", () => undefined);
else process.on("SIGTERM", () => process.exit(0));
const body = ${JSON.stringify(exporterText())};
setTimeout(() => {
  const server = http.createServer((req, res) => {
    if (req.url !== "/metrics") { res.writeHead(404); res.end(); return; }
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
    res.end(body);
  });
  server.on("error", (e) => { console.error("fake: " + e.message); process.exit(4); });
  server.listen(port, "127.0.0.1");
}, Number(process.env.FAKE_EXPORTER_DELAY_MS || 0));
`;
}
