// Injects a single-executable-application blob into a copy of a Linux x64 node binary.
//
// Node finds the blob at start-up by walking its own program headers for a PT_NOTE segment
// holding a note named NODE_SEA_BLOB, and only looks when the sentinel fuse string in its
// .rodata ends in ":1" instead of ":0". So injection is three edits of the ELF file:
//   1. append one new segment at the end of the file holding a copy of the program header table
//      (with two more entries) followed by the note;
//   2. point the ELF header and the PT_PHDR entry at that copy, which adds a PT_LOAD mapping the new
//      segment and a PT_NOTE over the note;
//   3. flip the fuse.
// Section headers are left as they are (nothing at run time reads them). This replaces postject,
// whose ELF library printed a "Can't find string offset for section name" warning per section
// name it re-wrote, and wrote the whole binary through a C++ round trip.
import { readFile, writeFile } from "node:fs/promises";

const FUSE = "NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2";
const NOTE_NAME = "NODE_SEA_BLOB";
const PT_LOAD = 1;
const PT_NOTE = 4;
const PT_PHDR = 6;
const PF_R = 4;
const PHDR_SIZE = 56;
const PAGE = 0x1000;

/** Raised when the input is not a binary this injector knows how to edit. */
export class SeaInjectError extends Error {
  name = "SeaInjectError";
}

const alignUp = (n, a) => Math.ceil(n / a) * a;

function readPhdr(buf, at) {
  return {
    type: buf.readUInt32LE(at),
    flags: buf.readUInt32LE(at + 4),
    offset: Number(buf.readBigUInt64LE(at + 8)),
    vaddr: Number(buf.readBigUInt64LE(at + 16)),
    paddr: Number(buf.readBigUInt64LE(at + 24)),
    filesz: Number(buf.readBigUInt64LE(at + 32)),
    memsz: Number(buf.readBigUInt64LE(at + 40)),
    align: Number(buf.readBigUInt64LE(at + 48)),
  };
}

function writePhdr(buf, at, p) {
  buf.writeUInt32LE(p.type, at);
  buf.writeUInt32LE(p.flags, at + 4);
  buf.writeBigUInt64LE(BigInt(p.offset), at + 8);
  buf.writeBigUInt64LE(BigInt(p.vaddr), at + 16);
  buf.writeBigUInt64LE(BigInt(p.paddr), at + 24);
  buf.writeBigUInt64LE(BigInt(p.filesz), at + 32);
  buf.writeBigUInt64LE(BigInt(p.memsz), at + 40);
  buf.writeBigUInt64LE(BigInt(p.align), at + 48);
}

/**
 * Returns a copy of `elf` (a node executable) carrying `blob` as its SEA resource.
 * @param {Buffer} elf
 * @param {Buffer} blob
 * @returns {Buffer}
 */
export function injectSeaBlob(elf, blob) {
  if (elf.readUInt32BE(0) !== 0x7f454c46 || elf[4] !== 2 || elf[5] !== 1) {
    throw new SeaInjectError("not a 64-bit little-endian ELF file");
  }
  if (elf.readUInt16LE(0x36) !== PHDR_SIZE) throw new SeaInjectError("unexpected program header size");
  const phoff = Number(elf.readBigUInt64LE(0x20));
  const phnum = elf.readUInt16LE(0x38);
  const phdrs = Array.from({ length: phnum }, (_, i) => readPhdr(elf, phoff + i * PHDR_SIZE));
  if (phdrs.some((p) => p.type === PT_NOTE && noteNamed(elf, p, NOTE_NAME))) {
    throw new SeaInjectError(`the binary already carries a ${NOTE_NAME} note`);
  }
  const fuseAt = findOnce(elf, Buffer.from(`${FUSE}:0`));
  const loads = phdrs.filter((p) => p.type === PT_LOAD);
  if (loads.length === 0) throw new SeaInjectError("no PT_LOAD segment");
  // The kernel (before Linux 5.18) computes AT_PHDR as the first PT_LOAD's vaddr - offset plus
  // e_phoff: keeping that difference for the new segment gives the same address either way.
  const bias = Math.min(...loads.map((p) => p.vaddr - p.offset));
  const memEnd = Math.max(...loads.map((p) => p.vaddr + p.memsz));
  const offset = alignUp(Math.max(elf.length, memEnd - bias), PAGE);
  const vaddr = bias + offset;

  const tableSize = (phnum + 2) * PHDR_SIZE;
  const noteAt = alignUp(tableSize, 8);
  const name = Buffer.from(`${NOTE_NAME}\0`);
  const noteSize = 12 + alignUp(name.length, 4) + alignUp(blob.length, 4);
  const segmentSize = noteAt + noteSize;

  const segment = Buffer.alloc(segmentSize);
  const lastLoad = phdrs.lastIndexOf(loads.at(-1));
  const table = [
    ...phdrs.slice(0, lastLoad + 1),
    {
      type: PT_LOAD,
      flags: PF_R,
      offset,
      vaddr,
      paddr: vaddr,
      filesz: segmentSize,
      memsz: segmentSize,
      align: PAGE,
    },
    ...phdrs.slice(lastLoad + 1),
    {
      type: PT_NOTE,
      flags: PF_R,
      offset: offset + noteAt,
      vaddr: vaddr + noteAt,
      paddr: vaddr + noteAt,
      filesz: noteSize,
      memsz: noteSize,
      align: 4,
    },
  ].map((p) =>
    p.type === PT_PHDR ? { ...p, offset, vaddr, paddr: vaddr, filesz: tableSize, memsz: tableSize } : p,
  );
  table.forEach((p, i) => writePhdr(segment, i * PHDR_SIZE, p));
  segment.writeUInt32LE(name.length, noteAt);
  segment.writeUInt32LE(blob.length, noteAt + 4);
  segment.writeUInt32LE(0, noteAt + 8);
  name.copy(segment, noteAt + 12);
  blob.copy(segment, noteAt + 12 + alignUp(name.length, 4));

  const out = Buffer.concat([elf, Buffer.alloc(offset - elf.length), segment]);
  out.writeBigUInt64LE(BigInt(offset), 0x20);
  out.writeUInt16LE(phnum + 2, 0x38);
  out.write("1", fuseAt + FUSE.length + 1, "latin1");
  return out;
}

function findOnce(buf, needle) {
  const at = buf.indexOf(needle);
  if (at < 0)
    throw new SeaInjectError(`no ${needle.toString()} fuse: not a node binary, or already injected`);
  if (buf.indexOf(needle, at + 1) >= 0)
    throw new SeaInjectError(`the fuse ${needle.toString()} occurs twice`);
  return at;
}

function noteNamed(buf, p, wanted) {
  for (let pos = p.offset; pos + 12 <= p.offset + p.filesz;) {
    const namesz = buf.readUInt32LE(pos);
    const descsz = buf.readUInt32LE(pos + 4);
    if (buf.toString("latin1", pos + 12, pos + 12 + namesz).replace(/\0$/, "") === wanted) return true;
    pos += 12 + alignUp(namesz, 4) + alignUp(descsz, 4);
  }
  return false;
}

/** Writes `output`: `node` with `blob` injected, executable. */
export async function injectSeaBlobFile(node, blob, output) {
  const out = injectSeaBlob(await readFile(node), await readFile(blob));
  await writeFile(output, out, { mode: 0o755 });
}
