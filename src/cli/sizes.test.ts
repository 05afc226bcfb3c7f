import { describe, expect, it } from "vitest";
import { formatBytes, InvalidSizeError, parseSize } from "./sizes.js";

describe("parseSize", () => {
  it("reads bytes, IEC and SI suffixes, and Docker's bare letters", () => {
    expect(parseSize("0")).toBe(0);
    expect(parseSize("1073741824")).toBe(1024 ** 3);
    expect(parseSize("512MiB")).toBe(512 * 1024 ** 2);
    expect(parseSize("4GiB")).toBe(4 * 1024 ** 3);
    expect(parseSize("4gib")).toBe(4 * 1024 ** 3);
    expect(parseSize("4g")).toBe(4 * 1024 ** 3);
    expect(parseSize("4G")).toBe(4 * 1024 ** 3);
    expect(parseSize("2GB")).toBe(2_000_000_000);
    expect(parseSize("10kB")).toBe(10_000);
    expect(parseSize("10k")).toBe(10_240);
    expect(parseSize("1TiB")).toBe(1024 ** 4);
    expect(parseSize("100b")).toBe(100);
    expect(parseSize(" 1 GiB ")).toBe(1024 ** 3);
  });

  it("takes fractions and rounds down to a byte", () => {
    expect(parseSize("1.5GiB")).toBe(1.5 * 1024 ** 3);
    expect(parseSize(".5KiB")).toBe(512);
    expect(parseSize("1.0001k")).toBe(1024);
  });

  it("refuses what is not a size", () => {
    for (const bad of [
      "",
      "GiB",
      "-1",
      "-1GiB",
      "4XB",
      "4 G B",
      "1e9",
      "NaN",
      "Infinity",
      "0x10",
      "1,5G",
      "4GiBs",
    ]) {
      expect(() => parseSize(bad), bad).toThrow(InvalidSizeError);
    }
  });

  it("refuses a size beyond 2^53 bytes", () => {
    expect(() => parseSize("9000000TiB")).toThrow(/too large/);
  });
});

describe("formatBytes", () => {
  it("prints decimal units with one decimal, like Docker's progress", () => {
    expect(formatBytes(0)).toBe("0 B");
    expect(formatBytes(999)).toBe("999 B");
    expect(formatBytes(1000)).toBe("1.0 kB");
    expect(formatBytes(12_345_678)).toBe("12.3 MB");
    expect(formatBytes(45_600_000)).toBe("45.6 MB");
    expect(formatBytes(3 * 1000 ** 3)).toBe("3.0 GB");
  });

  it("carries 999.96 into the next unit instead of printing 1000.0", () => {
    expect(formatBytes(999_960)).toBe("1.0 MB");
  });

  it("never prints a negative or non-finite count", () => {
    expect(formatBytes(-5)).toBe("0 B");
    expect(formatBytes(Number.NaN)).toBe("0 B");
  });
});
