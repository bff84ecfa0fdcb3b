/**
 * Values spelled as the Python device spells them, so that this device's messages and
 * `--print-settings` read the same: `repr` of what a user gave ('text', 3.0, True, None), a float's
 * shortest digits, `%g` of a bound, and JSON strings as `json.dumps` writes them; and numbers
 * read as Python's `float(text)` reads them.
 */

/** A JSON string as Python's json.dumps writes it (ensure_ascii: everything outside ' '..'~' escaped). */
export function jsonString(text: string): string {
  return JSON.stringify(text).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** Python's `repr` of a float: the shortest digits, fixed from 1e-4 to 1e16, else `1e+16`, `1.5e-05`. */
export function pyFloat(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mantissa, power] = Math.abs(x).toExponential().split("e") as [string, string];
  const digits = mantissa.replace(".", "");
  const exp = Number(power);
  const sign = x < 0 ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
    const whole = digits.padEnd(exp + 1, "0");
    return `${sign}${whole.slice(0, exp + 1)}.${whole.slice(exp + 1) || "0"}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
}

/** Python's `f"{x:g}"` for the bounds of the table (6 significant digits). */
export function pyG(x: number): string {
  return String(Number(x.toPrecision(6)));
}

/** Python's `repr` of what a config file or command line gave: 'text', 3, 3.0, True, None, ['a']. */
export function pyRepr(value: unknown): string {
  if (value === null || value === undefined) return "None";
  if (typeof value === "boolean") return value ? "True" : "False";
  if (typeof value === "bigint") return String(value);
  if (typeof value === "number") return pyFloat(value);
  if (Array.isArray(value)) return `[${value.map(pyRepr).join(", ")}]`;
  if (typeof value === "object") return `{${Object.entries(value).map(([k, v]) => `${pyRepr(k)}: ${pyRepr(v)}`).join(", ")}}`;
  const text = String(value);
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  const escaped = text.replace(/[\\\n\r\t]|[\x00-\x1f\x7f]/g, (c) => ({ "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t" })[c]
    ?? `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
  return quote + (quote === "'" ? escaped.replaceAll("'", "\\'") : escaped) + quote;
}

const DIGITS = String.raw`\d(?:_?\d)*`;
const DECIMAL = new RegExp(String.raw`^[+-]?(?:${DIGITS}(?:\.(?:${DIGITS})?)?|\.${DIGITS})(?:[eE][+-]?${DIGITS})?$`);

/** Python's `float(text)`: decimals with `_` between digits, exponents, inf and nan, around spaces; null otherwise. */
export function parseFloatText(text: string): number | null {
  const t = text.trim();
  const word = /^([+-]?)(inf|infinity|nan)$/i.exec(t);
  if (word) return word[2]!.toLowerCase() === "nan" ? NaN : (word[1] === "-" ? -Infinity : Infinity);
  return DECIMAL.test(t) ? Number(t.replaceAll("_", "")) : null;
}
