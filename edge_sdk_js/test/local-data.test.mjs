// A person's own data (src/local-data.ts): CSV rows, a folder of images and a text file as the device's x and y,
// with the shape and the class count its hello declares. Images are decoded by a decoder given here
// (a page passes the browser's, createImageBitmap into an OffscreenCanvas).
import assert from "node:assert/strict";
import { test } from "node:test";
import { csvData, imageData, textData } from "../dist/index.js";
import { tempDir } from "./tmp.mjs";

test("CSV: a header or none, the label by name or last, names numbered in sorted order", () => {
  const a = csvData("f1,f2,label\n1,2,0\n3,4.5,2\n\n");
  assert.deepEqual(a.x.shape, [2, 2]);
  assert.deepEqual([...a.x.data], [1, 2, 3, 4.5]);
  assert.deepEqual([...a.y.data], [0n, 2n]);
  assert.deepEqual(a.classes, ["0", "1", "2"], "integer labels are class indices: three classes declared");
  const b = csvData("label,x\ncat,1\ndog,2\ncat,3");
  assert.deepEqual([...b.x.data], [1, 2, 3]);
  assert.deepEqual([...b.y.data], [0n, 1n, 0n]);
  assert.deepEqual(b.classes, ["cat", "dog"]);
  const c = csvData('1,2,"b"\r\n3,4,"a"');
  assert.deepEqual(c.x.shape, [2, 2]);
  assert.deepEqual(c.classes, ["a", "b"]);
  assert.throws(() => csvData("1,2,0\n3,0"), /row 2 has 2 fields, not 3/);
  assert.throws(() => csvData("a,b,label\n1,x,0"), /row 2, column 2: "x" is not a number/);
  assert.throws(() => csvData(""), /empty/);
  assert.throws(() => csvData("x,y\n1,2", { label: "label" }), /no label column/);
});

test("images: one subfolder per class, resized to the model's input, grey or RGB, scaled to [0, 1]", async () => {
  const file = (path) => ({ name: path.split("/").at(-1), webkitRelativePath: path, type: "image/png" });
  const files = [file("pics/zebra/1.png"), file("pics/ant/2.png"), file("pics/ant/3.png"), { ...file("pics/notes.txt"), type: "text/plain" }];
  const asked = [];
  const decode = async (f, width, height) => { // a flat colour per class: red ants, white zebras
    asked.push([f.name, width, height]);
    const rgba = new Uint8ClampedArray(width * height * 4);
    for (let p = 0; p < width * height; p++) rgba.set(f.webkitRelativePath.includes("ant") ? [255, 0, 0, 255] : [255, 255, 255, 255], 4 * p);
    return rgba;
  };
  const rgb = await imageData(files, [3, 4, 5], decode);
  assert.deepEqual(rgb.x.shape, [3, 3, 4, 5]);
  assert.deepEqual(rgb.classes, ["ant", "zebra"]);
  assert.deepEqual([...rgb.y.data], [1n, 0n, 0n]);
  assert.deepEqual(asked[0], ["1.png", 5, 4]);
  assert.equal(rgb.x.data[20 * 3 + 0], 1, "an ant's red channel"); // second sample, channel 0
  assert.equal(rgb.x.data[20 * 3 + 20], 0, "an ant's green channel");
  const grey = await imageData(files, [64], decode); // digits: 8 x 8 grey, flattened
  assert.deepEqual(grey.x.shape, [3, 64]);
  assert.ok(Math.abs(grey.x.data[0] - 1) < 1e-6 && Math.abs(grey.x.data[64] - 0.299) < 1e-6);
  await assert.rejects(imageData(files, [10], decode), /cannot be made into samples of shape \[10\]/);
  await assert.rejects(imageData([file("flat.png")], [64], decode), /no images in class subfolders/);
});

test("text: next-character windows in the model's vocabulary, as the Python device reads the same file", async () => {
  const { execFileSync } = await import("node:child_process");
  const { writeFileSync } = await import("node:fs");
  const { join } = await import("node:path");
  const { python, pythonEnv } = await import("./cases.mjs");
  const { readLocalData } = await import("../dist/data-file.js");
  const dir = tempDir("edgetrain-text-");
  const file = join(dir, "mine.txt");
  writeFileSync(file, "Now is the winter of our discontent — 😀\nMade glorious summer by this sun of York;\n", "utf8");
  const script = "import json, sys\nfrom edge_sdk.data.sources import TextSource, vocabulary\n"
    + "s = TextSource(sys.argv[1], vocabulary('tinyshakespeare'), context=12, stride=5)\nx, y = s.arrays()\n"
    + "print(json.dumps({'x': x.tolist(), 'y': y.tolist(), 'skipped': s.skipped}))";
  const expected = JSON.parse(execFileSync(python(), ["-c", script, file], { env: pythonEnv(), encoding: "utf8" }));
  const fromFile = readLocalData(file, "-1", { vocabulary: "tinyshakespeare", context: 12, stride: 5 });
  const { readFileSync } = await import("node:fs");
  const inPage = textData(readFileSync(file, "utf8"), { context: 12, stride: 5 });
  for (const got of [fromFile, inPage]) {
    assert.deepEqual(got.x.shape, [expected.y.length, 12]);
    assert.deepEqual(Array.from(got.x.data, Number), expected.x.flat());
    assert.deepEqual(Array.from(got.y.data, Number), expected.y);
  }
  assert.equal(inPage.skipped, expected.skipped);
  assert.equal(inPage.classes.length, 65);
  assert.throws(() => textData("too short", { context: 40 }), /fewer than one sample/);
});
