// kafkajs over SASL_SSL for tests/integration/security/test_sasl_clients.py.
// usage: node sasl_client.js BROKER TOPIC MECHANISM USER PASSWORD CAFILE COUNT
// Produces COUNT messages, consumes them back, prints their values as JSON.
'use strict';
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

// MECHANISM "mtls": USER and PASSWORD are the client certificate and key files;
// "oauthbearer": PASSWORD is the token.
const [broker, topic, mechanism, username, password, cafile, count] = process.argv.slice(2);
const ssl = { ca: [fs.readFileSync(cafile, 'utf-8')] };
let sasl;
if (mechanism === 'mtls') {
  ssl.cert = fs.readFileSync(username, 'utf-8');
  ssl.key = fs.readFileSync(password, 'utf-8');
} else if (mechanism === 'oauthbearer') {
  sasl = { mechanism, oauthBearerProvider: async () => ({ value: password }) };
} else {
  sasl = { mechanism, username, password };
}
const kafka = new Kafka({
  clientId: 'kafscale-kafkajs-sasl',
  brokers: [broker],
  logLevel: logLevel.ERROR,
  ssl,
  sasl,
  retry: { retries: 5, initialRetryTime: 100 },
});

async function main() {
  const n = parseInt(count, 10);
  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < n; i++) messages.push({ value: `js${i}` });
  await producer.send({ topic, acks: -1, messages });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: `${topic}-g` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timed out')), 60000);
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push(message.value.toString());
        if (got.length >= n) { clearTimeout(timer); resolve(); }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  process.stdout.write(JSON.stringify(got));
}

main().catch((e) => { console.error(e); process.exit(1); });
