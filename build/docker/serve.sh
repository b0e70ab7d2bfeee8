#!/bin/sh
# locker-serve KIND PORT [EXTRA_PORT]: run one test server in the foreground on
# 127.0.0.1:PORT. State lives in the container's own file system (/srv), so it survives
# a stop/start of the same container and vanishes with it.
set -eu
kind="$1"; port="$2"; extra="${3:-}"
mkdir -p /srv

case "$kind" in
redis)
	exec redis-server --bind 127.0.0.1 --port "$port" --dir /srv --save '' --appendonly no \
		--protected-mode no --daemonize no --logfile ''
	;;
redis-cluster)
	# Three cluster-enabled masters in one container: locker-serve redis-cluster P1 P2 P3
	# with cluster bus ports P+10000 unless given as B1 B2 B3 after them. The provider
	# assigns the slots and makes the nodes meet.
	shift
	ports="$1 $2 $3"; b1="${4:-$(( $1 + 10000 ))}"; b2="${5:-$(( $2 + 10000 ))}"; b3="${6:-$(( $3 + 10000 ))}"
	set -- $ports
	node() { # port busport daemonize
		redis-server --bind 127.0.0.1 --port "$1" --cluster-enabled yes --cluster-port "$2" \
			--cluster-config-file "/srv/nodes-$1.conf" --cluster-announce-ip 127.0.0.1 \
			--cluster-node-timeout 5000 --dir /srv --save '' --appendonly no \
			--protected-mode no --daemonize "$3" --logfile "/srv/redis-$1.log"
	}
	node "$1" "$b1" yes
	node "$2" "$b2" yes
	exec redis-server --bind 127.0.0.1 --port "$3" --cluster-enabled yes --cluster-port "$b3" \
		--cluster-config-file "/srv/nodes-$3.conf" --cluster-announce-ip 127.0.0.1 \
		--cluster-node-timeout 5000 --dir /srv --save '' --appendonly no \
		--protected-mode no --daemonize no --logfile ''
	;;
postgres)
	bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
	data=/srv/pg
	if [ ! -s "$data/PG_VERSION" ]; then
		mkdir -p "$data" && chown postgres:postgres "$data"
		runuser -u postgres -- "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/srv/initdb.log 2>&1 \
			|| runuser -u postgres -- "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/srv/initdb.log 2>&1
		# A single-user run creates the role and database the DSN names.
		printf "CREATE ROLE locker LOGIN SUPERUSER PASSWORD 'locker';\n" | runuser -u postgres -- "$bin/postgres" --single -D "$data" postgres >/dev/null
		printf "CREATE DATABASE locker OWNER locker;\n" | runuser -u postgres -- "$bin/postgres" --single -D "$data" postgres >/dev/null
	fi
	# A kill leaves lock files behind; nothing else runs in this container, so drop them.
	rm -f "$data/postmaster.pid" /tmp/.s.PGSQL."$port" /tmp/.s.PGSQL."$port".lock
	# EXTRA_PORT names a primary's mode instead: "primary" commits as a
	# deployment does (a commit waits for its WAL, which the standby streams at
	# once), "primary-sync" also waits for a standby to have it
	# (synchronous_standby_names='*'). Without it, commits do not wait at all.
	commit="-c synchronous_commit=off"
	case "$extra" in
	primary) commit="-c synchronous_commit=on" ;;
	primary-sync) commit="-c synchronous_commit=on -c synchronous_standby_names=*" ;;
	esac
	set -f # $commit is split into words, never expanded as a file pattern
	exec runuser -u postgres -- "$bin/postgres" -D "$data" -h 127.0.0.1 -p "$port" -k /tmp \
		-c fsync=off $commit -c full_page_writes=off -c max_connections=200
	;;
postgres-standby)
	# locker-serve postgres-standby PORT PRIMARY_PORT: a streaming standby of the
	# postgres server on 127.0.0.1:PRIMARY_PORT (its initdb trusts replication from
	# 127.0.0.1), made by pg_basebackup at the first start; promoted by
	# SELECT pg_promote().
	bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
	data=/srv/pg
	if [ ! -s "$data/PG_VERSION" ]; then
		mkdir -p "$data" && chown postgres:postgres "$data" && chmod 0700 "$data"
		runuser -u postgres -- "$bin/pg_basebackup" -h 127.0.0.1 -p "$extra" -U postgres -D "$data" \
			-R -X stream -c fast >/srv/basebackup.log 2>&1 ||
			{ cat /srv/basebackup.log >&2; exit 1; }
	fi
	rm -f "$data/postmaster.pid" /tmp/.s.PGSQL."$port" /tmp/.s.PGSQL."$port".lock
	exec runuser -u postgres -- "$bin/postgres" -D "$data" -h 127.0.0.1 -p "$port" -k /tmp \
		-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 \
		-c hot_standby=on
	;;
mysql)
	data=/srv/mysql
	if [ ! -d "$data/mysql" ]; then
		mkdir -p "$data" && chown mysql:mysql "$data"
		mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=normal \
			--skip-test-db >/srv/install-db.log 2>&1
		cat >/srv/init.sql <<SQL
CREATE DATABASE IF NOT EXISTS locker;
CREATE USER IF NOT EXISTS 'locker'@'%' IDENTIFIED BY 'locker';
CREATE USER IF NOT EXISTS 'locker'@'localhost' IDENTIFIED BY 'locker';
GRANT ALL ON *.* TO 'locker'@'%';
GRANT ALL ON *.* TO 'locker'@'localhost';
SQL
	fi
	mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
	rm -f "/run/mysqld/mysqld-$port.pid" "/run/mysqld/mysqld-$port.sock" "/run/mysqld/mysqld-$port.sock.lock"
	# EXTRA_PORT names a replication role instead: "primary" (server id 1) or
	# "replica" (server id 2) write a row-based binary log (a replica's own
	# too, so that it can be promoted); the replication itself is set up over
	# SQL by the tests (integration/testserver, MariaDBReplica).
	binlog="--skip-log-bin"
	case "$extra" in
	primary) binlog="--log-bin=mysql-bin --server-id=1 --binlog-format=ROW" ;;
	replica) binlog="--log-bin=mysql-bin --server-id=2 --binlog-format=ROW --log-slave-updates" ;;
	esac
	exec mariadbd --user=mysql --datadir="$data" --bind-address=127.0.0.1 --port="$port" \
		--socket="/run/mysqld/mysqld-$port.sock" --pid-file="/run/mysqld/mysqld-$port.pid" \
		--init-file=/srv/init.sql --skip-name-resolve --innodb-flush-log-at-trx-commit=0 \
		$binlog --max-connections=300
	;;
zookeeper)
	mkdir -p /srv/zk
	cat >/srv/zoo.cfg <<CFG
tickTime=500
initLimit=10
syncLimit=5
dataDir=/srv/zk
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat
CFG
	# Debian's own class path (/etc/zookeeper/conf/environment); the jar's manifest
	# names its dependencies.
	cp=/etc/zookeeper/conf:/usr/share/java/zookeeper.jar
	exec java -Xmx256m -Dzookeeper.log.dir=/srv -Dzookeeper.root.logger=WARN,CONSOLE \
		-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain /srv/zoo.cfg
	;;
etcd)
	exec etcd --name locker --data-dir /srv/etcd \
		--listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
		--listen-peer-urls "http://127.0.0.1:$extra" --initial-advertise-peer-urls "http://127.0.0.1:$extra" \
		--initial-cluster "locker=http://127.0.0.1:$extra" --log-level warn
	;;
*)
	echo "locker-serve: unknown kind $kind" >&2; exit 2
	;;
esac
