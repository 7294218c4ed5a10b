package main

// Small system facts.

import (
	"io/fs"
	"runtime"
	"syscall"
)

func statOf(info fs.FileInfo) (*syscall.Stat_t, bool) {
	stat, ok := info.Sys().(*syscall.Stat_t)
	return stat, ok
}

func numCPU() int { return runtime.NumCPU() }
