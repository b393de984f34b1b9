// Parse AsyncAPI documents with the reference parser (@asyncapi/parser) and print its
// diagnostics, one line each: "<file>: <severity> <path>: <message> (<code>)".
// Exit 0 when no document has an error (warnings are printed, not fatal), 1 otherwise,
// 2 on bad usage. With --json, one JSON object per file instead: {file, valid, diagnostics}.
//
//   node tools/asyncapi/validate.mjs asyncapi.json [more.json ...] [--json]
import { readFile } from "node:fs/promises";
import { Parser } from "@asyncapi/parser";

const SEVERITY = ["error", "warning", "info", "hint"];
const args = process.argv.slice(2);
const json = args.includes("--json");
const files = args.filter((a) => a !== "--json");
if (files.length === 0) {
  console.error("usage: node validate.mjs FILE.json [FILE.json ...] [--json]");
  process.exit(2);
}

const parser = new Parser();
let failed = false;
for (const file of files) {
  let text;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    console.error(`${file}: cannot read: ${err.message}`);
    failed = true;
    continue;
  }
  const { document, diagnostics } = await parser.parse(text, { source: file });
  const found = diagnostics.map((d) => ({
    severity: SEVERITY[d.severity] ?? String(d.severity),
    code: String(d.code),
    path: (d.path || []).join("/"),
    message: d.message,
  }));
  const valid = document !== undefined && !found.some((d) => d.severity === "error");
  failed ||= !valid;
  if (json) {
    console.log(JSON.stringify({ file, valid, diagnostics: found }));
  } else {
    for (const d of found) {
      console.log(`${file}: ${d.severity} /${d.path}: ${d.message} (${d.code})`);
    }
    const errors = found.filter((d) => d.severity === "error").length;
    console.log(`${file}: ${valid ? "valid" : "INVALID"} AsyncAPI ${document?.version() ?? "?"} ` +
      `(${errors} errors, ${found.length - errors} other diagnostics)`);
  }
}
process.exit(failed ? 1 : 0);
