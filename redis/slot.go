package redis

import "strings"

// clusterSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of
// its hash tag, the part between the first "{" and the next "}" when that is
// not empty, else of the whole key, modulo 16384 (the Cluster specification,
// "Keys distribution model"). go-redis computes the same internally but does
// not export it; the hub needs it to tell which subscriptions a MOVED reply
// refused.
func clusterSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}
