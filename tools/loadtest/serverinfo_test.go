package main

import "testing"

func TestParseServerInfo(t *testing.T) {
	t.Parallel()
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:999\r\n"
	cpu, mem := parseServerInfo(info)
	if cpu != 3.75 || mem != 1048576 {
		t.Errorf("parseServerInfo = %v s, %d bytes; want 3.75 s, 1048576 bytes", cpu, mem)
	}
}
