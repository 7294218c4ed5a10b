package main

// Reading the Secrets and ConfigMaps that pods refer to, for env and volumes alike.

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// objectKind is a kind whose data a pod can use: "Secret" or "ConfigMap".
type objectKind string

const (
	secretKind    objectKind = "Secret"
	configMapKind objectKind = "ConfigMap"
)

// objectData is a Secret's or a ConfigMap's data (a ConfigMap's data and binaryData together).
// A missing object is nil data and no error when optional, an error otherwise.
func (p *provider) objectData(ctx context.Context, kind objectKind, namespace, name string, optional bool) (map[string][]byte, error) {
	data, err := p.readObjectData(ctx, kind, namespace, name)
	if apierrors.IsNotFound(err) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, namespace, name, err)
	}
	return data, nil
}

func (p *provider) readObjectData(ctx context.Context, kind objectKind, namespace, name string) (map[string][]byte, error) {
	if kind == secretKind {
		secret, err := p.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return secret.Data, nil
	}
	configMap, err := p.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{}
	for key, value := range configMap.Data {
		data[key] = []byte(value)
	}
	for key, value := range configMap.BinaryData {
		data[key] = value
	}
	return data, nil
}

// keyValue is one key of a Secret or ConfigMap; found is false for an optional key or object
// that is missing.
func (p *provider) keyValue(ctx context.Context, kind objectKind, namespace, name, key string, optional bool) (string, bool, error) {
	data, err := p.objectData(ctx, kind, namespace, name, optional)
	if err != nil {
		return "", false, err
	}
	value, ok := data[key]
	switch {
	case ok:
		return string(value), true, nil
	case optional:
		return "", false, nil
	}
	return "", false, fmt.Errorf("couldn't find key %s in %s %s/%s", key, kind, namespace, name)
}
