/**
 * The most of a container's output a log tail holds: `GET /api/tasks/{id}/logs` answers at most
 * this many bytes of output (plus nothing else), whatever `tail` asks for. A workload that prints
 * without newlines makes one "line" of any size; past the bound the tail keeps its end and the
 * first line is cut at its start.
 */
export const LOG_TAIL_MAX_BYTES = 1024 * 1024;

/**
 * How many log entries the first read of a tail asks the engine for (then 4× more each time, up
 * to the lines wanted). The engine splits output into entries of at most 16 KiB (its copier's
 * buffer), so a read of `n` entries moves at most `n × 16 KiB`: a tail of 10,000 lines of a
 * workload that printed 200 MB without newlines is one read of ~1 MiB, not 160 MB.
 */
export const LOG_TAIL_FIRST_ENTRIES = 64;

/** Grows the entries asked for until the tail holds its bytes or asks for every line wanted. */
export function nextLogTailEntries(entries: number, lines: number): number {
  return Math.min(lines, entries * 4);
}

/**
 * Collects the end of the Engine API's log stream as it arrives: the multiplexed frames (an
 * 8-byte header before each stdout/stderr payload) are undone on the fly, or the bytes taken as
 * they are for a TTY container (no headers), and only the last `maxBytes` of output are kept, so
 * memory stays bounded however much the engine sends.
 */
export class LogTailCollector {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  /** Output bytes seen (headers excluded). */
  seen = 0;
  private mode: "unknown" | "multiplexed" | "raw" = "unknown";
  /** Header bytes of the frame being read (multiplexed), until 8 have come. */
  private header = Buffer.alloc(0);
  /** Payload bytes left in the current frame. */
  private left = 0;

  constructor(private readonly maxBytes = LOG_TAIL_MAX_BYTES) {}

  /** Takes the next chunk of the stream. */
  push(chunk: Buffer): void {
    let data = chunk;
    if (this.mode === "unknown") {
      this.header = Buffer.concat([this.header, data]);
      if (this.header.length < 8) return;
      data = this.header;
      this.header = Buffer.alloc(0);
      this.mode = isFrameHeader(data, 0) ? "multiplexed" : "raw";
    }
    if (this.mode === "raw") {
      this.keep(data);
      return;
    }
    let offset = 0;
    while (offset < data.length) {
      if (this.left > 0) {
        const take = Math.min(this.left, data.length - offset);
        this.keep(data.subarray(offset, offset + take));
        this.left -= take;
        offset += take;
        continue;
      }
      const need = 8 - this.header.length;
      const part = data.subarray(offset, offset + need);
      this.header = this.header.length === 0 ? Buffer.from(part) : Buffer.concat([this.header, part]);
      offset += part.length;
      if (this.header.length === 8) {
        this.left = this.header.readUInt32BE(4);
        this.header = Buffer.alloc(0);
      }
    }
  }

  /** The last `maxBytes` of output as text; a character the cut split is dropped. */
  text(): string {
    // A stream shorter than one header: what came is output (a TTY container's few bytes).
    if (this.mode === "unknown" && this.header.length > 0) {
      this.keep(this.header);
      this.header = Buffer.alloc(0);
    }
    let all = Buffer.concat(this.chunks, this.kept);
    if (all.length > this.maxBytes) all = all.subarray(all.length - this.maxBytes);
    if (this.seen > this.maxBytes) {
      // Cut inside a UTF-8 sequence: skip its continuation bytes rather than show U+FFFD.
      let start = 0;
      while (start < all.length && start < 4 && ((all[start] ?? 0) & 0xc0) === 0x80) start++;
      all = all.subarray(start);
    }
    return all.toString("utf8");
  }

  private keep(data: Buffer): void {
    if (data.length === 0) return;
    this.seen += data.length;
    this.chunks.push(data);
    this.kept += data.length;
    // Drop whole chunks that fall out of the window; the rest is cut once, in text().
    while (this.chunks.length > 1 && this.kept - (this.chunks[0]?.length ?? 0) >= this.maxBytes) {
      this.kept -= this.chunks.shift()?.length ?? 0;
    }
  }
}

/** A Docker stream frame header at `offset`: stream 0, 1 or 2, then three zero bytes. */
function isFrameHeader(buffer: Buffer, offset: number): boolean {
  const stream = buffer[offset];
  return (
    (stream === 0 || stream === 1 || stream === 2) &&
    buffer[offset + 1] === 0 &&
    buffer[offset + 2] === 0 &&
    buffer[offset + 3] === 0
  );
}
