// kafkajs transactions for tests/integration/test_transactions_clients.py.
// usage: node txn.js BROKER TOPIC TRANSACTIONAL_ID GROUP
// Commits 10 records, aborts 10, commits 10 more with the group's offsets in the
// transaction, then reads the topic read_committed (kafkajs' default) in a fresh group.
// Prints one JSON document on stdout; exits non-zero on any error.
'use strict';
const { Kafka, logLevel } = require('kafkajs');

const [broker, topic, transactionalId, groupId] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: 'kafscale-kafkajs-txn',
  brokers: [broker],
  logLevel: logLevel.ERROR,
  retry: { retries: 8, initialRetryTime: 100 },
});

function batch(tag) {
  return Array.from({ length: 10 }, (_, i) => ({ partition: i % 2, value: `${tag}-${i}` }));
}

async function produce() {
  const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  let txn = await producer.transaction();
  await txn.send({ topic, messages: batch('js-c1') });
  await txn.commit();
  txn = await producer.transaction();
  await txn.send({ topic, messages: batch('js-a1') });
  await txn.abort();
  txn = await producer.transaction();
  await txn.send({ topic, messages: batch('js-c2') });
  await txn.sendOffsets({
    consumerGroupId: groupId,
    topics: [{ topic, partitions: [{ partition: 0, offset: '4' }, { partition: 1, offset: '6' }] }],
  });
  await txn.commit();
  await producer.disconnect();
}

async function consume(count) {
  const consumer = kafka.consumer({ groupId: `${groupId}-reader`, sessionTimeout: 10000 });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timeout: ${got.length} of ${count}`)), 30000);
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push(message.value.toString());
        if (got.length >= count) {
          clearTimeout(timer);
          setTimeout(resolve, 1500); // anything more (aborted records) would arrive meanwhile
        }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  return got;
}

async function main() {
  await produce();
  const admin = kafka.admin();
  await admin.connect();
  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] });
  await admin.disconnect();
  return { values: await consume(20), offsets };
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
