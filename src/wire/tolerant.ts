import Type, { type Static, type TSchema, type TUnsafe } from "typebox";

/*
 * One wire format, two readings. The server answers with the strict schemas of `schemas.ts`
 * (what the OpenAPI document states). A client reads answers of other shims too — older
 * taskshims that lack an extension field, dstack-shim that has none of them, newer ones whose
 * extension enums gained a value — so it checks them against a tolerant view derived here from
 * the same schemas, never against a second, hand-written copy.
 */

/** Marks a schema whose set of values may grow (set by {@link open}, read by {@link tolerant}). */
const OPEN: unique symbol = Symbol("taskshim.wire.open");

/**
 * A literal or a union of literals whose values a later shim may add to (an engine kind, a
 * lifecycle phase): the server still answers and documents only these values, a client accepts
 * any string there. The static type is `string` for that reason. The marker is a symbol key, so
 * the JSON schema (and the OpenAPI document) is the schema as given.
 */
export function open(schema: TSchema): TUnsafe<string> {
  // Enumerable, so that the copy `Type.Optional` makes keeps it; JSON leaves symbol keys out.
  return Object.assign(Type.Unsafe<string>(schema), { [OPEN]: true });
}

const isOpen = (schema: TSchema): boolean => (schema as { [OPEN]?: boolean })[OPEN] === true;

type Rest<P extends string, K> = P extends `${K & string}.${infer R}` ? R : never;

/**
 * The static type of a tolerant view: every property optional at every depth, except those
 * named by a dotted path in `R` (`"engine.status"`: `status`, required whenever `engine` is
 * there; an array's items are reached through the array's own name: `"tasks.id"`).
 */
export type Tolerant<T, R extends string = never> = T extends readonly (infer E)[]
  ? Tolerant<E, R>[]
  : T extends object
    ? { [K in keyof T as K extends R ? K : never]: Tolerant<T[K], Rest<R, K>> } & {
        [K in keyof T as K extends R ? never : K]?: Tolerant<T[K], Rest<R, K>>;
      }
    : T;

/** The paths of `required` below property `key`. */
const below = (required: readonly string[], key: string): string[] =>
  required.filter((p) => p.startsWith(`${key}.`)).map((p) => p.slice(key.length + 1));

function widen(schema: TSchema, required: readonly string[], where: string, used: Set<string>): TSchema {
  if (isOpen(schema)) return Type.String();
  if (Type.IsArray(schema)) return Type.Array(widen(schema.items, required, where, used));
  if (Type.IsUnion(schema)) return Type.Union(schema.anyOf.map((s) => widen(s, required, where, used)));
  if (!Type.IsObject(schema)) return schema;
  const properties: Record<string, TSchema> = {};
  for (const [key, property] of Object.entries(schema.properties)) {
    const inner = widen(property, below(required, key), `${where}${key}.`, used);
    const keep = required.includes(key) && !Type.IsOptional(property);
    if (required.includes(key)) used.add(`${where}${key}`);
    properties[key] = keep ? inner : Type.Optional(inner);
  }
  return Type.Object(properties);
}

/**
 * The tolerant view of a server schema, for a client: the fields named in `required` (dotted
 * paths, see {@link Tolerant}) stay required, every other field may be absent, and every
 * {@link open} value is any string. Everything else — types, closed enums such as the task
 * statuses — is the server's. A required path the schema does not have throws, at load.
 */
export function tolerant<T extends TSchema, const R extends string = never>(
  schema: T,
  required: readonly R[] = [],
): TUnsafe<Tolerant<Static<T>, R>> {
  const used = new Set<string>();
  const view = widen(schema, required, "", used);
  const unknown = required.filter((path) => !used.has(path));
  if (unknown.length > 0) throw new Error(`tolerant view: no such field: ${unknown.join(", ")}`);
  return Type.Unsafe<Tolerant<Static<T>, R>>(view);
}
