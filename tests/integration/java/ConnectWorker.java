import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.common.utils.Time;
import org.apache.kafka.connect.connector.policy.ConnectorClientConfigOverridePolicy;
import org.apache.kafka.connect.connector.policy.NoneConnectorClientConfigOverridePolicy;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.runtime.Herder;
import org.apache.kafka.connect.runtime.Worker;
import org.apache.kafka.connect.runtime.distributed.DistributedConfig;
import org.apache.kafka.connect.runtime.distributed.DistributedHerder;
import org.apache.kafka.connect.runtime.isolation.Plugins;
import org.apache.kafka.connect.runtime.rest.RestClient;
import org.apache.kafka.connect.runtime.rest.entities.ConnectorInfo;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.KafkaConfigBackingStore;
import org.apache.kafka.connect.storage.KafkaOffsetBackingStore;
import org.apache.kafka.connect.storage.KafkaStatusBackingStore;
import org.apache.kafka.connect.util.ConnectUtils;
import org.apache.kafka.connect.util.FutureCallback;
import org.apache.kafka.connect.util.SharedTopicAdmin;

/**
 * One Kafka Connect worker in distributed mode (kafka-connect 4.3's DistributedHerder with
 * its Kafka-backed config, offset and status topics), without the REST server: the jars at
 * hand lack its Jetty security module. It runs a FileStreamSource connector (SOURCE file to
 * TOPIC) and a FileStreamSink connector (TOPIC to SINK file), created unless the config
 * topic already holds them, until SINK has EXPECT lines; then it stops cleanly.
 *
 * <p>Args: bootstrap group source sink topic expect timeout_s
 */
public final class ConnectWorker {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], source = args[2], sink = args[3];
        String topic = args[4];
        int expect = Integer.parseInt(args[5]);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[6]));

        Map<String, String> props = new HashMap<>();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("key.converter", "org.apache.kafka.connect.storage.StringConverter");
        props.put("value.converter", "org.apache.kafka.connect.storage.StringConverter");
        props.put("config.storage.topic", group + "-configs");
        props.put("offset.storage.topic", group + "-offsets");
        props.put("status.storage.topic", group + "-status");
        props.put("config.storage.replication.factor", "1");
        props.put("offset.storage.replication.factor", "1");
        props.put("status.storage.replication.factor", "1");
        props.put("offset.flush.interval.ms", "500");
        props.put("plugin.discovery", "only_scan");

        Plugins plugins = new Plugins(props);
        plugins.compareAndSwapWithDelegatingLoader();
        DistributedConfig config = new DistributedConfig(props);
        String clusterId = config.kafkaClusterId();
        String clientIdBase = ConnectUtils.clientIdBase(config);
        Map<String, Object> adminProps = new HashMap<>(config.originals());
        adminProps.put("client.id", clientIdBase + "shared-admin");
        SharedTopicAdmin admin = new SharedTopicAdmin(adminProps);

        Converter offsetsConverter = plugins.newInternalConverter(
                true, JsonConverter.class.getName(), Map.of("schemas.enable", "false"));
        KafkaOffsetBackingStore offsets =
                new KafkaOffsetBackingStore(admin, () -> clientIdBase, offsetsConverter);
        offsets.configure(config);
        ConnectorClientConfigOverridePolicy policy = new NoneConnectorClientConfigOverridePolicy();
        Worker worker = new Worker("worker-" + ProcessHandle.current().pid(), Time.SYSTEM, plugins,
                config, offsets, policy);
        Converter internal = worker.getInternalValueConverter();
        KafkaStatusBackingStore status =
                new KafkaStatusBackingStore(Time.SYSTEM, internal, admin, clientIdBase);
        status.configure(config);
        KafkaConfigBackingStore configs = new KafkaConfigBackingStore(
                internal, config, worker.configTransformer(), admin, clientIdBase);
        DistributedHerder herder = new DistributedHerder(config, Time.SYSTEM, worker, clusterId,
                status, configs, "http://127.0.0.1:1/", new RestClient(config), policy,
                List.of(), admin);
        herder.start();
        try {
            FutureCallback<java.util.Collection<String>> listed = new FutureCallback<>();
            herder.connectors(listed);
            java.util.Collection<String> existing = listed.get(120, TimeUnit.SECONDS);
            System.out.println("existing=" + existing.size());
            if (!existing.contains("file-source")) {
                create(herder, "file-source", Map.of(
                        "connector.class", "org.apache.kafka.connect.file.FileStreamSourceConnector",
                        "file", source, "topic", topic, "tasks.max", "1"));
            }
            if (!existing.contains("file-sink")) {
                create(herder, "file-sink", Map.of(
                        "connector.class", "org.apache.kafka.connect.file.FileStreamSinkConnector",
                        "file", sink, "topics", topic, "tasks.max", "1"));
            }
            while (lines(sink) < expect) {
                if (System.nanoTime() > deadline) {
                    System.out.println("lines=" + lines(sink));
                    throw new IllegalStateException("the sink file did not fill in time");
                }
                Thread.sleep(100);
            }
            System.out.println("state=" + herder.connectorStatus("file-source").connector().state()
                    + "," + herder.connectorStatus("file-sink").connector().state());
        } finally {
            herder.stop();
        }
        System.out.println("lines=" + lines(sink));
        System.exit(0);  // the herder's threads are stopped; no non-daemon thread may hold us
    }

    private static void create(DistributedHerder herder, String name, Map<String, String> cfg)
            throws Exception {
        Map<String, String> withName = new HashMap<>(cfg);
        withName.put("name", name);
        FutureCallback<Herder.Created<ConnectorInfo>> cb = new FutureCallback<>();
        herder.putConnectorConfig(name, withName, false, cb);
        System.out.println("created=" + cb.get(120, TimeUnit.SECONDS).result().name());
    }

    private static long lines(String path) throws Exception {
        Path p = Path.of(path);
        if (!Files.exists(p)) {
            return 0;
        }
        try (var s = Files.lines(p)) {
            return s.count();
        }
    }
}
