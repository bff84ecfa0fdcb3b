/**
 * The nodes of an ONNX model's main graph (op type, name, outputs), read from its protobuf bytes
 * without a protobuf library: the WebGPU backend (src/backends/webgpu.ts) needs only these to tell
 * ONNX Runtime which nodes to keep off the GPU. Wire format: https://protobuf.dev/programming-guides/encoding/;
 * fields of onnx.proto: ModelProto.graph = 7, GraphProto.node = 1, NodeProto.output = 2, .name = 3, .op_type = 4.
 */

export interface OnnxNode {
  opType: string;
  name: string;
  outputs: string[];
}

/** A protobuf message's fields in order: [field number, wire type, value (number, or the bytes of a length-delimited field)]. */
function* fields(buf: Uint8Array): Generator<[number, number, number | Uint8Array]> {
  let pos = 0;
  const varint = (): number => {
    let value = 0;
    for (let shift = 0; ; shift += 7) {
      if (pos >= buf.length) throw new Error("not an ONNX model: a varint runs past the end");
      const byte = buf[pos++]!;
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
  };
  while (pos < buf.length) {
    const key = varint();
    const field = Math.floor(key / 8);
    const wire = key & 7;
    if (wire === 0) yield [field, wire, varint()];
    else if (wire === 1 || wire === 5) pos += wire === 1 ? 8 : 4;
    else if (wire === 2) {
      const length = varint();
      if (pos + length > buf.length) throw new Error("not an ONNX model: a field runs past the end");
      yield [field, wire, buf.subarray(pos, pos + length)];
      pos += length;
    } else throw new Error(`not an ONNX model: wire type ${wire}`);
  }
}

const text = new TextDecoder();

/** The main graph's nodes of the ONNX model `model` (a serialized ModelProto). */
export function onnxNodes(model: Uint8Array): OnnxNode[] {
  const nodes: OnnxNode[] = [];
  for (const [field, wire, graph] of fields(model)) {
    if (field !== 7 || wire !== 2) continue;
    for (const [nf, nw, node] of fields(graph as Uint8Array)) {
      if (nf !== 1 || nw !== 2) continue;
      const n: OnnxNode = { opType: "", name: "", outputs: [] };
      for (const [f, w, v] of fields(node as Uint8Array)) {
        if (w !== 2) continue;
        if (f === 2) n.outputs.push(text.decode(v as Uint8Array));
        else if (f === 3) n.name = text.decode(v as Uint8Array);
        else if (f === 4) n.opType = text.decode(v as Uint8Array);
      }
      nodes.push(n);
    }
  }
  return nodes;
}
