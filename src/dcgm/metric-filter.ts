/*
 * A task's share of DCGM Exporter's answer: the samples of the GPUs it holds, with the HELP and
 * TYPE lines of each metric that has one of them. The same rule as dstack-shim's FilterMetrics
 * (runner/internal/shim/dcgm/metrics.go): a sample is kept when its line contains one of the
 * task's GPU ids (NVIDIA ids are UUIDs, which DCGM Exporter writes in its `UUID` label); comments
 * other than HELP and TYPE and blank lines are dropped; a HELP or TYPE line is written once,
 * before the first kept sample after it, and only if some sample after it is kept.
 */

/**
 * The lines of `exposition` (Prometheus text format 0.0.4, as DCGM Exporter serves it) that
 * belong to the GPUs `gpuIds`, each line ending in `\n`. No ids (a task without GPUs): "".
 */
export function filterTaskMetrics(exposition: string, gpuIds: readonly string[]): string {
  // An empty id would be contained in every line: it would leak every GPU's samples.
  const ids = gpuIds.filter((id) => id !== "");
  if (ids.length === 0) return "";
  const out: string[] = [];
  let help: string | undefined;
  let type: string | undefined;
  for (const raw of exposition.split("\n")) {
    const line = raw.trim();
    if (line === "") continue;
    if (line.startsWith("# HELP")) {
      help = line;
      continue;
    }
    if (line.startsWith("# TYPE")) {
      type = line;
      continue;
    }
    if (line.startsWith("#")) continue;
    // One line per matching id, as dstack-shim writes it: ids are distinct UUIDs, so a sample
    // line names one of them at most.
    for (const id of ids) {
      if (!line.includes(id)) continue;
      if (help !== undefined) out.push(help);
      if (type !== undefined) out.push(type);
      help = undefined;
      type = undefined;
      out.push(line);
    }
  }
  return out.length === 0 ? "" : `${out.join("\n")}\n`;
}
