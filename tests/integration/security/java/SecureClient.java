// Kafka's Java client (kafka-clients 4.x) against a secured kafscale broker, for
// tests/integration/security/test_java_client.py.
// usage: java SecureClient roundtrip BOOTSTRAP CAFILE USER PASSWORD MECHANISM TOPIC COUNT
//        java SecureClient acls      BOOTSTRAP CAFILE USER PASSWORD MECHANISM TOPIC PRINCIPAL
// Prints one line of results; exits non-zero on an unexpected error.
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.errors.ClusterAuthorizationException;
import org.apache.kafka.common.resource.*;
import org.apache.kafka.common.serialization.*;

public class SecureClient {
  static Properties props(String[] a) {
    Properties p = new Properties();
    p.put("bootstrap.servers", a[1]);
    p.put("security.protocol", "SASL_SSL");
    p.put("ssl.truststore.type", "PEM");
    p.put("ssl.truststore.location", a[2]);
    p.put("sasl.mechanism", a[5]);
    String module = a[5].equals("PLAIN")
        ? "org.apache.kafka.common.security.plain.PlainLoginModule"
        : "org.apache.kafka.common.security.scram.ScramLoginModule";
    p.put("sasl.jaas.config", module + " required username=\"" + a[3] + "\" password=\"" + a[4] + "\";");
    return p;
  }

  public static void main(String[] a) throws Exception {
    if (a[0].equals("roundtrip")) roundtrip(a); else acls(a);
  }

  static void roundtrip(String[] a) throws Exception {
    String topic = a[6];
    int n = Integer.parseInt(a[7]);
    Properties pp = props(a);
    pp.put("key.serializer", StringSerializer.class.getName());
    pp.put("value.serializer", StringSerializer.class.getName());
    try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {  // idempotent by default
      for (int i = 0; i < n; i++) p.send(new ProducerRecord<>(topic, "k" + i, "v" + i)).get();
    }
    Properties cp = props(a);
    cp.put("group.id", topic + "-g");
    cp.put("auto.offset.reset", "earliest");
    cp.put("key.deserializer", StringDeserializer.class.getName());
    cp.put("value.deserializer", StringDeserializer.class.getName());
    List<String> got = new ArrayList<>();
    try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
      c.subscribe(List.of(topic));
      long end = System.currentTimeMillis() + 30000;
      while (got.size() < n && System.currentTimeMillis() < end) {
        for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) got.add(r.value());
      }
      c.commitSync();
    }
    System.out.println("consumed " + String.join(",", got));
  }

  static void acls(String[] a) throws Exception {
    String topic = a[6];
    String principal = a[7];
    try (Admin admin = Admin.create(props(a))) {
      AclBinding b = new AclBinding(
          new ResourcePattern(ResourceType.TOPIC, topic, PatternType.PREFIXED),
          new AccessControlEntry(principal, "*", AclOperation.READ, AclPermissionType.ALLOW));
      try {
        admin.createAcls(List.of(b)).all().get();
      } catch (ExecutionException e) {
        if (e.getCause() instanceof ClusterAuthorizationException) {
          System.out.println("denied");
          return;
        }
        throw e;
      }
      Collection<AclBinding> found = admin.describeAcls(new AclBindingFilter(
          new ResourcePatternFilter(ResourceType.TOPIC, topic, PatternType.MATCH),
          AccessControlEntryFilter.ANY)).values().get();
      int deleted = admin.deleteAcls(List.of(b.toFilter())).all().get().size();
      System.out.println("created described=" + found.size() + " deleted=" + deleted);
    }
  }
}
