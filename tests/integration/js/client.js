// kafkajs driver for tests/integration/test_clients_kafkajs.py.
// usage: node client.js produce BROKER TOPIC COUNT CODEC IDEMPOTENT
//        node client.js consume BROKER TOPIC COUNT GROUP
//        node client.js offsets BROKER TOPIC TIMESTAMP
// Prints one JSON document on stdout; exits non-zero on any error.
'use strict';
const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

const [cmd, broker, topic, arg1, arg2, arg3] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: 'kafscale-kafkajs-test',
  brokers: [broker],
  logLevel: logLevel.ERROR,
  retry: { retries: 5, initialRetryTime: 100 },
});

function messages(count) {
  const out = [];
  for (let i = 0; i < count; i++) {
    out.push({ key: `key-${i % 7}`, value: `value-${i}`, headers: { seq: `${i}`, src: 'kafkajs' } });
  }
  out.push({ key: null, value: 'null-key', timestamp: '1700000000999' });
  out.push({ key: 'tombstone', value: null });
  return out;
}

async function produce(count, codec, idempotent) {
  const producer = kafka.producer({ idempotent, maxInFlightRequests: idempotent ? 1 : 5 });
  await producer.connect();
  const compression = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP }[codec];
  const all = messages(count);
  const results = [];
  for (let i = 0; i < all.length; i += 100) {
    const md = await producer.send({ topic, acks: -1, compression, messages: all.slice(i, i + 100) });
    results.push(...md);
  }
  await producer.disconnect();
  return results;
}

async function consume(count, groupId) {
  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timeout: ${got.length} of ${count}`)), 30000);
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        const headers = {};
        for (const [k, v] of Object.entries(message.headers || {})) headers[k] = v.toString();
        got.push({
          partition,
          offset: Number(message.offset),
          key: message.key === null ? null : message.key.toString(),
          value: message.value === null ? null : message.value.toString(),
          headers,
          timestamp: Number(message.timestamp),
        });
        if (got.length >= count) {
          clearTimeout(timer);
          resolve();
        }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  return got;
}

async function offsets(ts) {
  const admin = kafka.admin();
  await admin.connect();
  const latest = await admin.fetchTopicOffsets(topic);
  const byTime = await admin.fetchTopicOffsetsByTimestamp(topic, Number(ts));
  await admin.disconnect();
  return { latest, byTime };
}

async function main() {
  if (cmd === 'produce') return produce(Number(arg1), arg2, arg3 === 'true');
  if (cmd === 'consume') return consume(Number(arg1), arg2);
  if (cmd === 'offsets') return offsets(arg1);
  throw new Error(`unknown command ${cmd}`);
}

main().then(
  (result) => {
    process.stdout.write(JSON.stringify(result) + '\n');
    process.exit(0);
  },
  (err) => {
    process.stderr.write(`${err.stack || err}\n`);
    process.exit(1);
  },
);
