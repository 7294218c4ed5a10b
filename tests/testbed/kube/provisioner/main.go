// Command provisioner is the test bed's storage provisioner. There is no kubelet and no CSI
// driver in the test bed, so this small loop plays both roles for PersistentVolumeClaims:
//
//   - it makes sure a default StorageClass exists that allows volume expansion;
//   - it creates a PersistentVolume, pre-bound to the claim, for every pending claim of that
//     class (the controller-manager's binder then completes the binding);
//   - it grows a bound claim's volume when the claim asks for more, and reports the new size in
//     the claim's status.capacity, as an external resizer would;
//   - it deletes the volumes it made once their claims are gone (reclaim policy Delete), and
//     their directories under --volumes-root, where pods on the real node keep their data.
//
// It polls instead of watching: the test bed is tiny and a poll loop is easy to follow.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	// provisionerName is what the StorageClass names and what the volumes are stamped with.
	provisionerName = "testbed.pgkube.dev/hostpath"
	// storageClassName is the default class created at start.
	storageClassName = "standard"
	// provisionedByAnnotation marks volumes made by a provisioner (same key as upstream).
	provisionedByAnnotation = "pv.kubernetes.io/provisioned-by"
)

// volumesRoot holds the volumes' directories: one test bed's own, so that deleting a volume
// removes its data and never another test bed's.
var volumesRoot = "/var/lib/pgkube-testbed"

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to the admin kubeconfig")
	interval := flag.Duration("interval", 500*time.Millisecond, "how often to look at claims")
	flag.StringVar(&volumesRoot, "volumes-root", volumesRoot, "directory that holds one directory per volume")
	qps := flag.Float64("kube-api-qps", 5, "client-side limit of requests per second to the API server (client-go's default)")
	burst := flag.Int("kube-api-burst", 10, "requests allowed at once above --kube-api-qps (client-go's default)")
	flag.Parse()

	client, err := newClient(*kubeconfig, float32(*qps), *burst)
	if err != nil {
		log.Fatalf("kubernetes client: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	for ctx.Err() == nil {
		if err := reconcile(ctx, client); err != nil {
			log.Printf("reconcile: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(*interval):
		}
	}
	log.Print("stopping")
}

func newClient(kubeconfig string, qps float32, burst int) (*kubernetes.Clientset, error) {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	config.QPS = qps
	config.Burst = burst
	return kubernetes.NewForConfig(config)
}

// reconcile runs one pass over the storage class, the claims and the volumes.
func reconcile(ctx context.Context, client *kubernetes.Clientset) error {
	if err := ensureStorageClass(ctx, client); err != nil {
		return fmt.Errorf("storage class: %w", err)
	}
	claims, err := client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list claims: %w", err)
	}
	for i := range claims.Items {
		if err := reconcileClaim(ctx, client, &claims.Items[i]); err != nil {
			log.Printf("claim %s/%s: %v", claims.Items[i].Namespace, claims.Items[i].Name, err)
		}
	}
	return deleteReleasedVolumes(ctx, client)
}

func ensureStorageClass(ctx context.Context, client *kubernetes.Clientset) error {
	_, err := client.StorageV1().StorageClasses().Get(ctx, storageClassName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	expand := true
	reclaim := corev1.PersistentVolumeReclaimDelete
	binding := storagev1.VolumeBindingImmediate
	class := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name: storageClassName,
			Annotations: map[string]string{
				"storageclass.kubernetes.io/is-default-class": "true",
			},
		},
		Provisioner:          provisionerName,
		AllowVolumeExpansion: &expand,
		ReclaimPolicy:        &reclaim,
		VolumeBindingMode:    &binding,
	}
	_, err = client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{})
	if err == nil {
		log.Printf("created default storage class %q", storageClassName)
	}
	return err
}

func reconcileClaim(ctx context.Context, client *kubernetes.Clientset, claim *corev1.PersistentVolumeClaim) error {
	if claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != storageClassName {
		return nil
	}
	switch {
	case claim.DeletionTimestamp != nil:
		return nil
	case claim.Spec.VolumeName == "" && claim.Status.Phase == corev1.ClaimPending:
		return provisionVolume(ctx, client, claim)
	case claim.Status.Phase == corev1.ClaimBound:
		return expandIfRequested(ctx, client, claim)
	}
	return nil
}

// volumeName is deterministic so a second pass never creates a second volume for a claim.
func volumeName(claim *corev1.PersistentVolumeClaim) string {
	return "pvc-" + string(claim.UID)
}

func provisionVolume(ctx context.Context, client *kubernetes.Clientset, claim *corev1.PersistentVolumeClaim) error {
	size, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("claim has no storage request")
	}
	hostPathType := corev1.HostPathDirectoryOrCreate
	volume := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        volumeName(claim),
			Annotations: map[string]string{provisionedByAnnotation: provisionerName},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   claim.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              storageClassName,
			VolumeMode:                    claim.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				Kind:       "PersistentVolumeClaim",
				APIVersion: "v1",
				Namespace:  claim.Namespace,
				Name:       claim.Name,
				UID:        claim.UID,
			},
			// Pods on kwok nodes never touch it; pods on the test bed's real node mount it.
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{
					Path: filepath.Join(volumesRoot, volumeName(claim)),
					Type: &hostPathType,
				},
			},
		},
	}
	_, err := client.CoreV1().PersistentVolumes().Create(ctx, volume, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err == nil {
		log.Printf("provisioned %s (%s) for %s/%s", volume.Name, size.String(), claim.Namespace, claim.Name)
	}
	return err
}

// expandIfRequested grows the volume, then the claim's reported capacity, when the claim's
// request is larger than what it has.
func expandIfRequested(ctx context.Context, client *kubernetes.Clientset, claim *corev1.PersistentVolumeClaim) error {
	requested, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	current := claim.Status.Capacity[corev1.ResourceStorage]
	if !ok || requested.Cmp(current) <= 0 {
		return nil
	}
	volume, err := client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get volume: %w", err)
	}
	if volume.Annotations[provisionedByAnnotation] != provisionerName {
		return nil
	}
	if volume.Spec.Capacity.Storage().Cmp(requested) < 0 {
		volume.Spec.Capacity[corev1.ResourceStorage] = requested
		if _, err := client.CoreV1().PersistentVolumes().Update(ctx, volume, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("grow volume: %w", err)
		}
	}
	updated := claim.DeepCopy()
	if updated.Status.Capacity == nil {
		updated.Status.Capacity = corev1.ResourceList{}
	}
	updated.Status.Capacity[corev1.ResourceStorage] = requested
	updated.Status.AllocatedResources = corev1.ResourceList{corev1.ResourceStorage: requested}
	updated.Status.AllocatedResourceStatuses = nil
	updated.Status.Conditions = nil
	if _, err := client.CoreV1().PersistentVolumeClaims(claim.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update claim status: %w", err)
	}
	log.Printf("expanded %s/%s to %s", claim.Namespace, claim.Name, requested.String())
	return nil
}

func deleteReleasedVolumes(ctx context.Context, client *kubernetes.Clientset) error {
	volumes, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	for _, volume := range volumes.Items {
		if volume.Annotations[provisionedByAnnotation] != provisionerName || volume.Status.Phase != corev1.VolumeReleased {
			continue
		}
		err := client.CoreV1().PersistentVolumes().Delete(ctx, volume.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			log.Printf("delete released volume %s: %v", volume.Name, err)
			continue
		}
		log.Printf("deleted released volume %s", volume.Name)
		removeVolumeData(volume)
	}
	return nil
}

// removeVolumeData deletes a deleted volume's directory, if it is one of ours.
func removeVolumeData(volume corev1.PersistentVolume) {
	if volume.Spec.HostPath == nil {
		return
	}
	path := filepath.Clean(volume.Spec.HostPath.Path)
	if filepath.Dir(path) != filepath.Clean(volumesRoot) || filepath.Base(path) != volume.Name {
		return
	}
	if err := os.RemoveAll(path); err != nil {
		log.Printf("remove the data of %s: %v", volume.Name, err)
	}
}
