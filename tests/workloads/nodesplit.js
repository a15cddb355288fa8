// The Node.js test's workload (tests/integration/node.rs), with splits built in.
//   cpu SECONDS   batch(), run from the event loop (setImmediate) every turn,
//                 calls parent() 20 times, which runs heavy() and light(): 2:1
//                 iterations of the same loop body; V8 optimizes parent()
//                 (inlining both) and batch() as they are called
//   osr SECONDS   the same split from one long loop in main(), which V8
//                 optimizes while it runs (on-stack replacement)
//   deopt SECONDS as cpu; on SIGUSR2, batch2() takes over from batch(), and
//                 parent() calls heavy() and light() with numbers that are not
//                 small integers (20000.5, 10000.5: the same 2:1 of
//                 iterations): V8 throws its code for them away (deoptimizes)
//                 and optimizes them again
//   wake SECONDS  the main thread blocks in waitMain() (Atomics.wait) until a
//                 worker thread's notifier() wakes it, every 20 ms
//   off SECONDS   cycle(), an async function, awaits a 10 ms timer, then blocks
//                 20 ms in waitA() and 30 ms in waitB() (Atomics.wait): 1:2:3
//                 off the CPU
//   inline SECONDS batchI(), from the event loop, calls
//                 - parentI(), which runs outerA() and outerB(), both of which
//                   run inner(): 2:1 iterations; V8 inlines all three into
//                   parentI() (two levels, one function inlined at two sites)
//                 - parentB(), which runs searchA() and searchB(), inlined into
//                   it, each calling the builtin String.prototype.indexOf on a
//                   string of 2:1 length that does not hold what is searched:
//                   the time is in the builtin, and parentB()'s frame is found
//                   by its return address, which stands right after the call,
//                   at the end of the inlined function's code
//   create SECONDS batchC(), from the event loop, calls parentC(), which
//                 calls make() twice, 2:1 times Object.create() in a loop
//                 (V8 inlines make() into parentC(), or not): the builtin
//                 behind it, CreateObjectWithoutProperties, runs without a
//                 frame of its own (its caller's frame is found by the
//                 return address at the top of the stack)
'use strict';

let sink = 0;

function heavy(n) {
  let x = 1;
  for (let i = 0; i < n; i++) x = (x * 31 + i) | 0;
  return x;
}

function light(n) {
  let x = 1;
  for (let i = 0; i < n; i++) x = (x * 37 + i) | 0;
  return x;
}

// Called often enough (tens of thousands of times a second) for V8 to
// optimize parent() itself, with heavy() and light() inlined.
let half = false;

function parent(frac) {
  sink += heavy(frac ? 20000.5 : 20000);
  sink += light(frac ? 10000.5 : 10000);
}

function batch() {
  for (let k = 0; k < 20; k++) parent(false);
}

function batch2() {
  for (let k = 0; k < 20; k++) parent(true);
}

function tick(end) {
  if (half) batch2();
  else batch();
  if (Date.now() < end) setImmediate(tick, end);
}

function main(end) {
  while (Date.now() < end) parent(false);
}

function inner(n) {
  let x = 1;
  for (let i = 0; i < n; i++) x = (x * 41 + i) | 0;
  return x;
}

function outerA(n) {
  return inner(2 * n);
}

function outerB(n) {
  return inner(n);
}

function parentI() {
  sink += outerA(100000);
  sink += outerB(100000);
}

// Flat strings of 2:1 length: 'ab' repeated, then searched for 'abd'.
const hayA = ('ab'.repeat(160000) + 'x').split('').join('');
const hayB = ('ab'.repeat(80000) + 'x').split('').join('');

function searchA(s) {
  return s.indexOf('abd');
}

function searchB(s) {
  return s.indexOf('abd');
}

function parentB() {
  sink += searchA(hayA);
  sink += searchB(hayB);
}

function batchI() {
  for (let k = 0; k < 20; k++) {
    parentI();
    parentB();
  }
}

function tickI(end) {
  batchI();
  if (Date.now() < end) setImmediate(tickI, end);
}

let sinkO = null;
const protoX = { a: 1 };
const protoY = { b: 2 };

function make(p, n) {
  let o;
  for (let i = 0; i < n; i++) o = Object.create(p);
  return o;
}

function parentC(px, py) {
  sinkO = make(px, 2000);
  sinkO = make(py, 1000);
}

function batchC() {
  for (let k = 0; k < 20; k++) {
    parentC(protoX, protoY);
    parentC(protoY, protoX);
  }
}

function tickC(end) {
  batchC();
  if (Date.now() < end) setImmediate(tickC, end);
}

const cell = new Int32Array(new SharedArrayBuffer(4));

function waitA() {
  Atomics.wait(cell, 0, 0, 20);
}

function waitB() {
  Atomics.wait(cell, 0, 0, 30);
}

function nap(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function cycle(end) {
  while (Date.now() < end) {
    await nap(10);
    waitA();
    waitB();
  }
}

function waitMain() {
  Atomics.wait(cell, 0, 0);
  Atomics.store(cell, 0, 0);
}

function notifier(shared) {
  Atomics.store(shared, 0, 1);
  Atomics.notify(shared, 0);
}

const { Worker, isMainThread, workerData } = require('worker_threads');
if (!isMainThread) {
  // The worker: every 20 ms (its own timed wait), wake the main thread.
  const pause = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    Atomics.wait(pause, 0, 0, 20);
    notifier(workerData);
  }
}

const [mode, secs] = [process.argv[2], Number(process.argv[3] || 10)];
const end = Date.now() + secs * 1000;
// SIGTERM ends the modes that run on the event loop early, through
// process.exit, so that --cpu-prof still writes its profile.
process.on('SIGTERM', () => process.exit(0));
if (!isMainThread) {
  // (the worker never gets here)
} else if (mode === 'cpu') {
  tick(end);
} else if (mode === 'deopt') {
  process.on('SIGUSR2', () => {
    console.log('switching');
    half = true;
  });
  tick(end);
} else if (mode === 'wake') {
  const w = new Worker(__filename, { workerData: cell });
  while (Date.now() < end) waitMain();
  w.terminate();
} else if (mode === 'osr') {
  main(end);
} else if (mode === 'off') {
  cycle(end);
} else if (mode === 'inline') {
  tickI(end);
} else if (mode === 'create') {
  tickC(end);
} else {
  throw new Error(`mode: cpu, deopt, wake, osr, off, inline or create, not ${mode}`);
}
