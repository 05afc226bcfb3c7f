import { describe, expect, it } from "vitest";
import { LOG_TAIL_FIRST_ENTRIES, LogTailCollector, nextLogTailEntries } from "./log-tail.js";

/** One frame of Docker's multiplexed log stream. */
function frame(stream: 1 | 2, text: string | Buffer): Buffer {
  const payload = typeof text === "string" ? Buffer.from(text) : text;
  const header = Buffer.alloc(8);
  header[0] = stream;
  header.writeUInt32BE(payload.length, 4);
  return Buffer.concat([header, payload]);
}

/** Feeds `data` in chunks of `size` bytes. */
function collect(data: Buffer, size: number, maxBytes?: number): LogTailCollector {
  const collector = new LogTailCollector(maxBytes);
  for (let i = 0; i < data.length; i += size) collector.push(data.subarray(i, i + size));
  return collector;
}

describe("LogTailCollector", () => {
  const stream = Buffer.concat([frame(1, "out1\n"), frame(2, "err\n"), frame(1, "out2\n")]);

  it("undoes the frames however the stream is chunked, headers split included", () => {
    for (const size of [1, 3, 7, 8, 9, 13, stream.length]) {
      const collector = collect(stream, size);
      expect(collector.text(), `chunks of ${size}`).toBe("out1\nerr\nout2\n");
      expect(collector.seen).toBe(14);
    }
  });

  it("takes a TTY container's stream (no headers) as it is, a stream shorter than a header too", () => {
    expect(collect(Buffer.from("plain tty output\n"), 5).text()).toBe("plain tty output\n");
    expect(collect(Buffer.from("hi\n"), 1).text()).toBe("hi\n");
    expect(new LogTailCollector().text()).toBe("");
  });

  it("keeps only the last maxBytes of output, however much comes, the cut line keeping its end", () => {
    const big = Buffer.concat([
      ...Array.from({ length: 200 }, () => frame(1, Buffer.alloc(16 * 1024, "x"))),
      frame(1, "tail line\n"),
    ]);
    const collector = collect(big, 65_536, 100_000);
    const text = collector.text();
    expect(text.length).toBe(100_000);
    expect(text.endsWith("xxtail line\n")).toBe(true);
    expect(collector.seen).toBe(200 * 16 * 1024 + 10);
  });

  it("never starts with half a character when the cut falls inside one", () => {
    const collector = collect(frame(1, "ééééé"), 4, 4); // 10 bytes, the last 4 are "éé"
    expect(collector.text()).toBe("éé");
    const odd = collect(frame(1, "ééééé"), 4, 5); // the 5th byte from the end is inside an é
    expect(odd.text()).toBe("éé");
  });
});

describe("nextLogTailEntries", () => {
  it("grows 4× from the first read up to the lines wanted", () => {
    const reads: number[] = [];
    for (let n = Math.min(10_000, LOG_TAIL_FIRST_ENTRIES); ; n = nextLogTailEntries(n, 10_000)) {
      reads.push(n);
      if (n >= 10_000) break;
    }
    expect(reads).toEqual([64, 256, 1024, 4096, 10_000]);
    expect(nextLogTailEntries(5, 5)).toBe(5);
  });
});
