// bench/node's workload: CPU-bound, DEPTH JavaScript frames deep.
//   node nodedeep.js SECONDS DEPTH [count]
// A round descends DEPTH frames (down() calls itself, so V8 can inline only
// a few levels of it) and spins at the bottom. With "count", prints each
// second "SECOND ROUNDS CPU_NS" (the process's own CPU time).
'use strict';

let sink = 0;

function spin() {
  let x = 1;
  for (let i = 0; i < 20000; i++) x = (x * 31 + i) | 0;
  return x;
}

function down(n) {
  if (n <= 1) return spin();
  return down(n - 1) + 1;
}

const secs = Number(process.argv[2]);
const depth = Number(process.argv[3]);
const count = process.argv[4] === 'count';
const t0 = process.hrtime.bigint();
const end = t0 + BigInt(Math.round(secs * 1e9));
let rounds = 0;
let next = t0 + 1000000000n;
let second = 0;
function cpuNs() {
  const u = process.cpuUsage();
  return (u.user + u.system) * 1000;
}
for (;;) {
  // The entry frames (the module wrapper and Node's loader) are the rest of the depth.
  sink += down(depth - 8);
  rounds++;
  const now = process.hrtime.bigint();
  if (now >= next) {
    second++;
    next += 1000000000n;
    if (count) console.log(`${second} ${rounds} ${cpuNs()}`);
    if (now >= end) break;
  }
}
