// The ELF header facts the release build checks: that a Node.js binary it is about to embed, or
// an executable it wrote, is a 64-bit little-endian Linux executable for the arch it claims. A
// wrong file (an x64 node cached as the arm64 one, a truncated download) would otherwise become
// a release binary that fails only on the host it is installed on.
import { open } from "node:fs/promises";

/** e_machine of each arch a release is built for (ELF specification, `EM_X86_64`, `EM_AARCH64`). */
export const ELF_MACHINE = Object.freeze({ x64: 62, arm64: 183 });

/** A file that is not the ELF executable it should be. */
export class ElfMismatchError extends Error {
  name = "ElfMismatchError";
}

/**
 * The arch (a key of {@link ELF_MACHINE}) of a 64-bit little-endian ELF file.
 * @param {string} path
 * @returns {Promise<keyof typeof ELF_MACHINE>}
 * @throws {ElfMismatchError} when it is not ELF, not 64-bit little-endian, or of another machine
 */
export async function elfArch(path) {
  const file = await open(path, "r");
  let head;
  try {
    head = Buffer.alloc(20);
    const { bytesRead } = await file.read(head, 0, head.length, 0);
    if (bytesRead < head.length) throw new ElfMismatchError(`${path}: ${bytesRead} bytes, too short for ELF`);
  } finally {
    await file.close();
  }
  if (head.readUInt32BE(0) !== 0x7f454c46) throw new ElfMismatchError(`${path}: not an ELF file`);
  // EI_CLASS 2 = ELFCLASS64, EI_DATA 1 = ELFDATA2LSB: every Linux x64 and arm64 build of Node.js.
  if (head[4] !== 2 || head[5] !== 1) {
    throw new ElfMismatchError(
      `${path}: not a 64-bit little-endian ELF file (class ${head[4]}, data ${head[5]})`,
    );
  }
  const machine = head.readUInt16LE(18);
  const arch = Object.entries(ELF_MACHINE).find(([, m]) => m === machine)?.[0];
  if (arch === undefined)
    throw new ElfMismatchError(`${path}: ELF machine ${machine}, neither x64 nor arm64`);
  return /** @type {keyof typeof ELF_MACHINE} */ (arch);
}

/**
 * Fails unless `path` is a 64-bit little-endian ELF file for `arch`.
 * @param {string} path
 * @param {string} arch a Node.js `process.arch` name
 * @throws {ElfMismatchError}
 */
export async function expectElfArch(path, arch) {
  const found = await elfArch(path);
  if (found !== arch) {
    throw new ElfMismatchError(
      `${path}: an ELF file for ${found} (machine ${ELF_MACHINE[found]}), not ${arch}`,
    );
  }
}
