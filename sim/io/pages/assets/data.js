/* The page's data: one base64 text inlined in the page, gzip-compressed, holding a JSON document whose numeric
 * columns are binary (sim/io/pages/payload.py writes it; the layout is described there). Decoded with the
 * browser's own DecompressionStream: nothing is fetched. */
(function (PS) {
  "use strict";

  const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, i2: Int16Array, i1: Int8Array, u1: Uint8Array,
    u2: Uint16Array, u4: Uint32Array};

  function base64Bytes(text) {
    const raw = atob(text.replace(/\s+/g, ""));
    const out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  /* Replace every {"$col": i} in the document by a typed-array view of column i. */
  function attach(value, columns) {
    if (Array.isArray(value)) return value.map((v) => attach(v, columns));
    if (value && typeof value === "object") {
      if (Object.prototype.hasOwnProperty.call(value, "$col")) return columns[value.$col];
      const out = {};
      for (const k of Object.keys(value)) out[k] = attach(value[k], columns);
      return out;
    }
    return value;
  }

  /* The document inlined in <script type="application/octet-stream" id=...>. */
  async function load(id) {
    const node = document.getElementById(id);
    const bytes = await gunzip(base64Bytes(node.textContent));
    const magic = String.fromCharCode(bytes[0], bytes[1], bytes[2], bytes[3]);
    if (magic !== "PSB1") throw new Error(`unknown page data format ${JSON.stringify(magic)}`);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const headerLength = view.getUint32(4, true);
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
    const base = bytes.byteOffset + Math.ceil((8 + headerLength) / 8) * 8; // columns start 8-byte aligned
    const columns = header.columns.map((c) => {
      const Type = TYPES[c.dtype];
      if (!Type) throw new Error(`unknown column type ${c.dtype}`);
      return new Type(bytes.buffer, base + c.offset, c.length);
    });
    return attach(header.doc, columns);
  }

  PS.data = {load, base64Bytes, gunzip};
})(globalThis.PS = globalThis.PS || {});
