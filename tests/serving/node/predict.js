// An independent client for the streamrec gRPC API: loads serving/streamrec.proto with
// @grpc/proto-loader and calls Predict (and Status) with @grpc/grpc-js.
//
// usage: node predict.js <host:port> <path/to/streamrec.proto> [token] < events.json
// events.json: a JSON array of {dense: [..], sparse: {field: [ids]}, request_id}; ids are numbers
// (integers below 2^53) or strings (hashed by the server). Prints one JSON line:
// {"version": "<int>", "scores": [...], "request_ids": [...], "status": {...}}
'use strict';
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, protoPath, token = ''] = process.argv.slice(2);
if (!target || !protoPath) {
  console.error('usage: node predict.js <host:port> <streamrec.proto> [token] < events.json');
  process.exit(2);
}
const def = protoLoader.loadSync(path.basename(protoPath), {
  includeDirs: [path.dirname(protoPath)], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const api = grpc.loadPackageDefinition(def).streamrec.v1;
const client = new api.StreamRec(target, grpc.credentials.createInsecure());

const events = JSON.parse(fs.readFileSync(0, 'utf8')).map((ev) => ({
  ts: String(ev.ts || 0),
  dense: ev.dense || [],
  request_id: ev.request_id || '',
  sparse: Object.fromEntries(Object.entries(ev.sparse || {}).map(([k, v]) => {
    const vs = Array.isArray(v) ? v : [v];
    // numbers are integer ids; strings are hashed by the server (xxh64), as in the event contract
    return [k, { ids: vs.filter((x) => typeof x === 'number').map((x) => String(x)),
                 keys: vs.filter((x) => typeof x === 'string') }];
  })),
}));

const md = new grpc.Metadata();
if (token) md.add('authorization', `Bearer ${token}`);
const deadline = () => new Date(Date.now() + 20000);

client.Predict({ events }, md, { deadline: deadline() }, (err, resp) => {
  if (err) {
    console.error(`Predict failed: ${err.code} ${err.details}`);
    process.exit(1);
  }
  client.Status({}, { deadline: deadline() }, (err2, status) => {
    if (err2) {
      console.error(`Status failed: ${err2.code} ${err2.details}`);
      process.exit(1);
    }
    console.log(JSON.stringify({ version: resp.model_version, scores: resp.scores,
                                 request_ids: resp.request_ids, status }));
    client.close();
  });
});
